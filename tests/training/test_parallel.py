"""refddp.training.parallel: the DDP and FSDP2 strategies behind one interface, proven on gloo ranks.

FSDP must train exactly like DDP (float64: within rounding) with accumulation and clipping,
and its checkpoint state must be DDP's (full, clean keys, torch's optimizer layout) so runs
move between strategies.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from refddp.config.schema import TrainConfig
from refddp.launch.dist import DistContext
from refddp.testing.checks.collectives import process_group_sequence
from refddp.training.parallel import FullyShardedParallel, Parallel, build_parallel, fsdp_blocks
from refddp.workload.models import build_model
from tests.rank_tasks import fit_recording_collectives
from tests.torch_features import needs_fsdp2

CONFIG = {"input_dim": 8, "hidden_size": 16, "depth": 3, "num_classes": 3, "dtype": "float64"}


def _ctx() -> DistContext:
    return DistContext(dist.get_rank(), dist.get_world_size(), dist.get_rank(), "cpu", "gloo")


def _train(parallel: Parallel, optimizer: torch.optim.Optimizer, steps: int, accum: int,
           clip: float) -> None:  # fmt: skip
    """Each rank trains on its interleaved share of the same global batches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(8 * world * accum, 8, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (8 * world * accum,), generator=g)
        mine_x, mine_y = x[rank::world], y[rank::world]
        for micro in range(accum):
            part = slice(micro * 8, (micro + 1) * 8)
            context = parallel.no_sync() if micro < accum - 1 else torch.enable_grad()
            with context:
                loss = F.cross_entropy(parallel.module(mine_x[part]), mine_y[part]) / accum
                loss.backward()
        if clip:
            parallel.grad_norm(clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _optimizer(model: torch.nn.Module, name: str) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def fsdp_vs_ddp(optimizer: str, sum_gradients: bool = False) -> float | None:
    """Largest relative difference between DDP's and FSDP's weights after 4 steps (rank 0)."""
    c = TrainConfig(**CONFIG)
    ddp = Parallel(build_model(c), c, _ctx())
    fsdp = FullyShardedParallel(build_model(c), c, _ctx())
    if sum_gradients:  # the gloo reduce-scatter pitfall (pytorch#162338): sum, not average
        for module in fsdp.model.modules():
            if hasattr(module, "set_gradient_divide_factor"):
                module.set_gradient_divide_factor(1.0)
    for parallel in (ddp, fsdp):
        opt = _optimizer(parallel.model, optimizer)
        _train(parallel, opt, steps=4, accum=2, clip=0.5)
    full = fsdp.model_state_dict()
    if dist.get_rank() != 0:
        return None
    ours = ddp.model_state_dict()
    return max(((full[k] - v).abs().max() / v.abs().max()).item() for k, v in ours.items())


@needs_fsdp2
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fsdp_trains_like_ddp_with_accumulation_and_clipping(spawn, optimizer):
    diffs = spawn(fsdp_vs_ddp, optimizer, world_size=2)
    assert diffs[0] is not None and diffs[0] < 1e-12, diffs


@needs_fsdp2
def test_fsdp_vs_ddp_comparison_catches_summed_gradients(spawn):
    # Negative sibling: the same comparison with FSDP summing gradients over ranks must fail.
    diffs = spawn(fsdp_vs_ddp, "sgd", sum_gradients=True, world_size=2)
    assert diffs[0] > 1e-3, diffs


def state_round_trip() -> dict | None:
    """DDP-trained state loaded into FSDP, gathered back, and loaded into a plain model."""
    c = TrainConfig(**CONFIG)
    ddp = Parallel(build_model(c), c, _ctx())
    ddp_opt = _optimizer(ddp.model, "adamw")
    _train(ddp, ddp_opt, steps=2, accum=1, clip=0.0)
    model_state, opt_state = ddp.model_state_dict(), ddp.optimizer_state_dict(ddp_opt)

    fsdp = FullyShardedParallel(build_model(TrainConfig(**CONFIG, seed=99)), c, _ctx())
    fsdp_opt = _optimizer(fsdp.model, "adamw")
    fsdp.load_state(model_state, fsdp_opt, opt_state)
    back_model, back_opt = fsdp.model_state_dict(), fsdp.optimizer_state_dict(fsdp_opt)
    shard = fsdp.local_numel()
    if dist.get_rank() != 0:
        return {"shard": shard}
    plain = build_model(TrainConfig(**CONFIG, seed=5))
    plain.load_state_dict(back_model)  # clean, full keys: loads into a bare model
    plain_opt = _optimizer(plain, "adamw")
    plain_opt.load_state_dict(back_opt)  # torch's own optimizer layout
    return {
        "keys": sorted(back_model) == sorted(model_state),
        "model_equal": all(torch.equal(back_model[k], v) for k, v in model_state.items()),
        "exp_avg_equal": all(
            torch.equal(back_opt["state"][i]["exp_avg"], s["exp_avg"])
            for i, s in opt_state["state"].items()
        ),
        "steps": [float(s["step"]) for s in back_opt["state"].values()],
        "shard": shard,
        "total": sum(p.numel() for p in plain.parameters()),
    }


@needs_fsdp2
def test_checkpoint_state_moves_between_ddp_fsdp_and_one_process(spawn):
    rank0, rank1 = spawn(state_round_trip, world_size=2)
    assert rank0["keys"] and rank0["model_equal"] and rank0["exp_avg_equal"], rank0
    assert set(rank0["steps"]) == {2.0}
    # Each rank stores about half of every parameter (dim-0 shards; odd sizes round).
    assert rank0["shard"] + rank1["shard"] == rank0["total"]
    assert abs(rank0["shard"] - rank0["total"] / 2) <= 0.1 * rank0["total"]


def collectives_per_micro_batch() -> dict:
    """Default-group collectives of one micro-batch with and without gradient sync."""
    c = TrainConfig(**CONFIG)
    fsdp = FullyShardedParallel(build_model(c), c, _ctx())
    x, y = torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, dtype=torch.long)
    counts = {}
    for name, context in (("no_sync", fsdp.no_sync()), ("sync", torch.enable_grad())):
        before = process_group_sequence()
        with context:
            F.cross_entropy(fsdp.module(x), y).backward()
        counts[name] = process_group_sequence() - before
    counts["units"] = len(fsdp_blocks(fsdp.model))  # the MLP's root holds no parameter itself
    return counts


def collectives_of_the_gradient_norm(strategy: str) -> dict:
    """Default-group collectives of ``grad_norm`` without and with clipping, after one
    backward, and the norms it returned."""
    c = TrainConfig(**CONFIG)
    parallel = build_parallel(build_model(c), c, _ctx()) if strategy == "ddp" else (
        FullyShardedParallel(build_model(c), c, _ctx()))  # fmt: skip
    torch.manual_seed(dist.get_rank())  # each rank its own batch
    x, y = torch.randn(4, 8, dtype=torch.float64), torch.randint(0, 3, (4,))
    F.cross_entropy(parallel.module(x), y).backward()
    found = {}
    for name, max_norm in (("norm", 0.0), ("clipped", 1e-3), ("after", 0.0)):
        before = process_group_sequence()
        norm = parallel.grad_norm(max_norm)
        found[name] = (process_group_sequence() - before, float(norm), type(norm).__name__)
    return found


@pytest.mark.parametrize("strategy, collectives", [("ddp", 0), pytest.param("fsdp", 1, marks=needs_fsdp2)])
def test_the_gradient_norm_is_every_ranks_alike_for_one_all_reduce_at_most(
    spawn, strategy, collectives
):
    # DDP's gradient is whole on every rank: its norm needs no collective. FSDP's is sharded:
    # one all-reduce of the shards' norms, which clipping then uses (not a second).
    ranks = spawn(collectives_of_the_gradient_norm, strategy, world_size=2)
    for rank in ranks:
        assert [rank[k][0] for k in ("norm", "clipped", "after")] == [collectives] * 3, rank
        assert all(rank[k][2] == "Tensor" for k in rank), "a plain tensor, whatever the strategy"
        assert rank["norm"][1] == rank["clipped"][1] > 1e-3, "the norm before clipping"
        assert rank["after"][1] == pytest.approx(1e-3, rel=1e-3), "clipped to the bound"
    assert ranks[0] == ranks[1], "every rank the same norm"


@needs_fsdp2
def test_fsdp_accumulation_skips_the_gradient_reduce_scatter(spawn):
    counts = spawn(collectives_per_micro_batch, world_size=2)[0]
    # One reduce-scatter per FSDP unit, and only when the gradient is synchronised.
    assert counts["sync"] - counts["no_sync"] == counts["units"], counts


@needs_fsdp2
@pytest.mark.parametrize("ckpt_format", ["full", "dcp"])
def test_every_fsdp_rank_issues_the_same_collectives_with_an_uneven_last_eval_shard(
    spawn, tmp_path, ckpt_format
):
    # val_size 37 at 3 ranks x batch 4: shards of 13, 12 and 12 samples, 4, 3 and 3 batches;
    # every FSDP forward gathers parameters, so every rank must run 4 (lockstep eval).
    runs = spawn(fit_recording_collectives, str(tmp_path), strategy="fsdp", val_size=37,
                 ckpt_format=ckpt_format, max_steps=4, ckpt_every=3, world_size=3)  # fmt: skip
    logs = [r["log"] for r in runs]
    assert logs[0] == logs[1] == logs[2]
    kinds = {entry.split("(")[0] for entry in logs[0]}
    # FSDP's own all-gathers and reduce-scatters are among the collectives checked and compared.
    assert {"all_gather_single", "reduce_scatter_single", "broadcast_object_list"} <= kinds, kinds
    assert len({r["sequence"] for r in runs}) == 1


@needs_fsdp2
def test_the_trainer_under_fsdp_reduce_scatters_once_per_optimizer_step_whatever_the_accumulation(
    spawn, tmp_path
):
    # The trainer's accumulation keeps gradient sync off through each earlier micro-batch's
    # backward, where FSDP reads it: not only through its forward.
    scatters = {}
    for accum in (1, 2):
        runs = spawn(fit_recording_collectives, str(tmp_path / f"accum{accum}"), strategy="fsdp",
                     grad_accum=accum, max_steps=2, world_size=2)  # fmt: skip
        scatters[accum] = sum(entry.startswith("reduce_scatter") for entry in runs[0]["log"])
    assert scatters[1] > 0 and scatters[2] == scatters[1], scatters
