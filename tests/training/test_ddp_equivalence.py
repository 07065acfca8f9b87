"""Torch facts refddp's trainer relies on, checked on raw DDP, plus the trainer's fp16 and
non-finite-loss handling.

The raw-DDP tests here prove torch, not refddp: DDP averages gradients over every bucket, the
average equals one process on the global batch, ``no_sync`` skips the all-reduce, DDP
re-broadcasts rank 0's buffers. They stay because the trainer's guarantees are built on them
(if a torch upgrade broke one, these name the cause). What refddp adds on top is proven through
the trainer: test_cli.py (world-size and accumulation invariance), test_trainer_guarantees.py
(all-reduce count under accumulation, buffers after fit), test_realistic_models.py.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.rank_tasks import fit

STEPS, BATCH, FEATURES = 4, 6, 10


def make_model(seed=0, buffers=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(FEATURES, 32), nn.Tanh()]
    if buffers:
        layers.append(nn.BatchNorm1d(32))
    layers += [nn.Linear(32, 32), nn.Tanh()] * 3 + [nn.Linear(32, 3)]
    return nn.Sequential(*layers).double()


def global_batch(step, world_size):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(world_size * BATCH, FEATURES, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (world_size * BATCH,), generator=g)
    return x, y


def my_shard(x, same_shard_bug=False):
    rank = 0 if same_shard_bug else dist.get_rank()
    return x[rank * BATCH : (rank + 1) * BATCH]


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def grads_after_backward(sync=True):
    # A tiny bucket cap splits the gradients over many all-reduce buckets.
    ddp = DDP(make_model(), bucket_cap_mb=0.001)
    for step in range(2):  # DDP rebuilds its buckets with bucket_cap_mb after the first step
        ddp.zero_grad()
        x, y = global_batch(step, dist.get_world_size())
        with ddp.no_sync() if not sync else torch.enable_grad():
            F.cross_entropy(ddp(my_shard(x)), my_shard(y)).backward()
    return flat_grads(ddp.module), len(ddp.reducer._get_zeros_like_grad_buckets())


def test_gradients_are_identical_on_every_rank_with_many_buckets(spawn):
    results = spawn(grads_after_backward, world_size=3)
    assert results[0][1] >= 3, "the test must exercise several DDP buckets"
    for grads, _ in results[1:]:
        assert torch.equal(grads, results[0][0])


def test_gradient_check_detects_unsynced_gradients(spawn):
    results = spawn(grads_after_backward, False, world_size=3)
    assert not torch.equal(results[0][0], results[1][0])


def ddp_training(optimizer_name, same_shard_bug=False):
    ddp = DDP(make_model())
    opt = (
        torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        if optimizer_name == "sgd"
        else torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    )
    for step in range(STEPS):
        x, y = global_batch(step, dist.get_world_size())
        opt.zero_grad()
        F.cross_entropy(ddp(my_shard(x, same_shard_bug)), my_shard(y, same_shard_bug)).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in ddp.parameters()])


def single_process_training(optimizer_name, world_size):
    model = make_model()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if optimizer_name == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-2)
    )
    for step in range(STEPS):
        x, y = global_batch(step, world_size)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("optimizer_name", ["sgd", "adamw"])
def test_ddp_equals_one_process_on_the_global_batch(spawn, optimizer_name):
    ranks = spawn(ddp_training, optimizer_name, world_size=3)
    expected = single_process_training(optimizer_name, 3)
    for params in ranks:
        torch.testing.assert_close(params, expected, rtol=1e-12, atol=1e-12)


def test_equivalence_check_detects_a_sharding_bug(spawn):
    ranks = spawn(ddp_training, "sgd", True, world_size=3)
    assert not torch.allclose(ranks[0], single_process_training("sgd", 3), rtol=1e-6)


def replicas_after_training(broadcast_buffers=True):
    ddp = DDP(make_model(seed=dist.get_rank(), buffers=True), broadcast_buffers=broadcast_buffers)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = global_batch(step, dist.get_world_size())
        opt.zero_grad()
        F.cross_entropy(ddp(my_shard(x)), my_shard(y)).backward()
        opt.step()
    # What the next forward sees: DDP re-broadcasts rank 0's buffers at each forward.
    ddp.eval()
    with torch.no_grad():
        ddp(torch.zeros(2, FEATURES, dtype=torch.float64))
    return {k: v.clone() for k, v in ddp.module.state_dict().items()}


def test_replicas_stay_in_sync_parameters_and_buffers(spawn):
    # Each rank initialises differently: DDP's construction broadcast must fix that.
    states = spawn(replicas_after_training, world_size=3)
    assert any("running_mean" in k for k in states[0])
    for state in states[1:]:
        for key, value in state.items():
            assert torch.equal(value, states[0][key]), key


def test_sync_check_detects_unbroadcast_buffers(spawn):
    states = spawn(replicas_after_training, False, world_size=3)
    assert not torch.equal(states[0]["2.running_mean"], states[1]["2.running_mean"])


def accumulation(micro_steps):
    """Grads after k no_sync micro-batches + 1 synced one, and whether they matched mid-way."""
    ddp = DDP(make_model())
    x, y = global_batch(0, dist.get_world_size() * micro_steps)
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [
        (
            x[i * world * BATCH + rank * BATCH :][:BATCH],
            y[i * world * BATCH + rank * BATCH :][:BATCH],
        )
        for i in range(micro_steps)
    ]
    mid_way = None
    for i, (xb, yb) in enumerate(mine):
        last = i == micro_steps - 1
        with ddp.no_sync() if not last else torch.enable_grad():
            (F.cross_entropy(ddp(xb), yb) / micro_steps).backward()
        if i == 0 and not last:
            mid_way = flat_grads(ddp.module).clone()
    return flat_grads(ddp.module), mid_way


def test_gradient_accumulation_equals_the_big_batch_and_syncs_only_at_the_end(spawn):
    k, world = 3, 2
    results = spawn(accumulation, k, world_size=world)
    assert not torch.equal(results[0][1], results[1][1]), "no_sync micro-steps must not sync"
    model = make_model()
    x, y = global_batch(0, world * k)
    F.cross_entropy(model(x), y).backward()
    for grads, _ in results:
        torch.testing.assert_close(grads, flat_grads(model), rtol=1e-12, atol=1e-14)


def test_fp16_scaler_skips_overflowing_steps_on_every_rank_alike(spawn, tmp_path):
    # Rank 1's gradient overflows every third step; after DDP's all-reduce every rank holds
    # the inf, so GradScaler must skip that step and halve its scale on every rank (counted
    # as skipped, as any non-finite step: the losses stayed finite).
    results = spawn(
        fit, str(tmp_path), model="tests.user_code:spiky_mlp", amp="fp16", dtype="float32", epochs=1
    )
    steps = results[0]["step"]
    assert steps >= 6 and results[0]["result"]["skipped_steps"] == steps // 3
    assert results[0]["scale"] == results[1]["scale"] == 65536.0 * 0.5 ** (steps // 3)
    for key, value in results[0]["weights"].items():
        assert torch.isfinite(value).all(), key
        assert torch.equal(value, results[1]["weights"][key]), key


def test_nonfinite_loss_is_skipped_on_every_rank_alike(spawn, tmp_path):
    # Half the inputs are inf, on whichever rank draws them: every rank must skip together.
    results = spawn(fit, str(tmp_path), data="tests.user_code:exploding_datasets", epochs=1)
    skipped = [r["result"]["skipped_steps"] for r in results]
    assert skipped[0] > 0 and skipped[0] == skipped[1]
    assert skipped[0] < results[0]["step"], "finite steps still train"
    for key, value in results[0]["weights"].items():
        assert torch.isfinite(value).all(), key
        assert torch.equal(value, results[1]["weights"][key]), key


def test_one_process_skips_the_same_nonfinite_steps_as_two_ranks(spawn, tmp_path):
    # One process has nobody to agree with (its agreement is its own): same global batches,
    # so the same steps must be skipped and the same weights come out.
    job = dict(data="tests.user_code:exploding_datasets", epochs=1, global_batch_size=8)
    one = spawn(fit, str(tmp_path / "one"), world_size=1, **job)[0]
    two = spawn(fit, str(tmp_path / "two"), world_size=2, **job)[0]
    skipped = one["result"]["skipped_steps"]
    assert 0 < skipped == two["result"]["skipped_steps"] < one["step"] == two["step"]
    for key, value in one["weights"].items():
        assert torch.isfinite(value).all(), key
        torch.testing.assert_close(value, two["weights"][key], rtol=1e-9, atol=1e-12, msg=key)


def test_bf16_training_stays_close_to_fp32(spawn, tmp_path):
    common = dict(dtype="float32", epochs=3, train_size=512, val_size=256, batch_size=16)
    fp32 = spawn(fit, str(tmp_path / "fp32"), amp="off", **common)[0]["result"]["metrics"]
    bf16 = spawn(fit, str(tmp_path / "bf16"), amp="bf16", **common)[0]["result"]["metrics"]
    assert abs(bf16["val_loss"] - fp32["val_loss"]) < 0.05 * fp32["val_loss"]
    assert abs(bf16["val_acc"] - fp32["val_acc"]) < 0.05
