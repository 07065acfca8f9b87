"""The real trainer, run on every rank through `spawn`: collective order, checkpoints, resume, eval."""

import re

import pytest
import torch

from refddp.checkpoints.full import LATEST
from refddp.config.schema import ConfigError
from refddp.testing import RankFailure, RankTimeout
from refddp.workload.models import build_model
from tests.rank_tasks import (
    autocast_dtypes_seen,
    count_step_collectives,
    eval_model,
    first_update_norm,
    fit,
    fit_recording_collectives,
    fit_seeded,
    host_draws_after_resume,
    scale_after_resume,
    tiny_config,
)
from tests.torch_features import needs_fsdp2

GLOBAL = 12  # divides by 1, 2 and 3 ranks


def assert_same_weights(a, b, rtol=0.0, atol=0.0):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


def test_every_rank_issues_the_same_collectives_through_train_eval_save_and_logging(
    spawn, tmp_path
):
    runs = spawn(
        fit_recording_collectives,
        str(tmp_path),
        progress=True,
        ckpt_every=3,
        eval_every=5,
        world_size=3,
    )
    logs = [r["log"] for r in runs]
    assert logs[0] == logs[1] == logs[2]
    kinds = {entry.split("(")[0] for entry in logs[0]}
    assert {"all_reduce", "broadcast_object_list", "all_gather_object"} <= kinds
    # DDP's own gradient all-reduces bypass Python; the group's sequence number counts them.
    assert len({r["sequence"] for r in runs}) == 1


def test_rank0_progress_logging_and_checkpoints_finish_at_world_size_4(spawn, tmp_path):
    results = spawn(
        fit, str(tmp_path), progress=True, ckpt_every=1, eval_every=4, world_size=4, timeout=120
    )
    assert {r["step"] for r in results} == {results[0]["step"]} and results[0]["step"] > 0
    assert (tmp_path / "checkpoints" / LATEST).exists()


def test_ddp_checkpoint_loads_strictly_into_a_plain_model_with_identical_outputs(spawn, tmp_path):
    ranks = spawn(fit, str(tmp_path), world_size=2)
    ckpt = torch.load(tmp_path / "checkpoints" / LATEST, weights_only=True)
    plain = build_model(ckpt["config"])
    plain.load_state_dict(ckpt["model_state_dict"], strict=True)
    ddp_trained = build_model(ckpt["config"])
    ddp_trained.load_state_dict(ranks[0]["weights"])
    x = torch.randn(5, ckpt["config"]["input_dim"], dtype=torch.float64)
    assert torch.equal(plain(x), ddp_trained(x))
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt["model_state_dict"])


@pytest.mark.parametrize("sizes", [(1, 2), (2, 1), (1, 2, 3)], ids=lambda s: "->".join(map(str, s)))
def test_resume_at_another_world_size_continues_the_same_run(spawn, tmp_path, sizes):
    flags = dict(global_batch_size=GLOBAL, epochs=3, optimizer="adamw")
    straight = spawn(fit, str(tmp_path / "straight"), world_size=1, **flags)[0]
    out = str(tmp_path / "hopping")
    for size in sizes[:-1]:  # each leg stops mid-epoch (8 steps per epoch here)
        spawn(fit, out, world_size=size, stop_after=5, **flags)
    last = spawn(fit, out, world_size=sizes[-1], **flags)[0]
    assert last["step"] == straight["step"] == 24
    # Same samples per step, same optimizer state: equal up to float64 reduction order.
    assert_same_weights(last["weights"], straight["weights"], rtol=1e-9, atol=1e-12)


def test_resume_check_detects_a_lost_optimizer_state(spawn, tmp_path):
    flags = dict(global_batch_size=GLOBAL, epochs=3, optimizer="adamw")
    straight = spawn(fit, str(tmp_path / "straight"), world_size=1, **flags)[0]
    out = tmp_path / "hopping"
    spawn(fit, str(out), world_size=2, stop_after=5, **flags)
    path = out / "checkpoints" / LATEST
    state = torch.load(path, weights_only=True)
    state["optimizer_state_dict"]["state"] = {}  # what a resume that forgets Adam's moments does
    torch.save(state, path)
    last = spawn(fit, str(out), world_size=1, **flags)[0]
    with pytest.raises(AssertionError):
        assert_same_weights(last["weights"], straight["weights"], rtol=1e-9, atol=1e-12)


RESUMES = [(1, "ddp", "mlp"), (2, "ddp", "mlp"), (3, "ddp", "mlp"), (4, "ddp", "mlp"),
           (2, "fsdp", "mlp"), (3, "fsdp", "mlp"), (4, "fsdp", "mlp"),
           (3, "ddp", "convnet")]  # BatchNorm and dropout, through DDP's settling backward


@pytest.mark.parametrize(("world_size", "strategy", "model"), [
    pytest.param(n, s, m, id=f"{s}-{n}" + ("-convnet" if m == "convnet" else ""),
                 marks=needs_fsdp2 if s == "fsdp" else ())
    for n, s, m in RESUMES])  # fmt: skip
def test_exact_resume_in_process_is_bit_identical(spawn, tmp_path, world_size, strategy, model):
    # At 3+ ranks the sum over ranks depends on where a gradient lies in DDP's buckets: the
    # resumed run's first step must use the layout the uninterrupted run's step there did.
    flags = dict(world_size=world_size, ckpt_every=2, strategy=strategy, model=model,
                 global_batch_size=24)  # (divides by 1-4 ranks)  # fmt: skip
    straight = spawn(fit_seeded, str(tmp_path / "a"), **flags)[0]
    spawn(fit_seeded, str(tmp_path / "b"), stop_after=7, **flags)
    resumed = spawn(fit_seeded, str(tmp_path / "b"), **flags)[0]
    assert resumed["step"] == straight["step"]
    assert_same_weights(resumed["weights"], straight["weights"])  # bit for bit


@pytest.mark.parametrize(("saved_at", "resumed_at"), [(1, 2), (3, 2)])
def test_a_resume_at_another_world_size_gives_each_rank_its_own_streams_the_same_every_time(
    spawn, tmp_path, saved_at, resumed_at
):
    # The checkpoint holds one RNG state per rank of the run that saved it: at another world
    # size each rank's torch, Python and numpy streams are seeded afresh, from the seed, the
    # step and the rank. Ranks that drew one stream would add the same noise to different
    # samples; a rerun of the same resume must draw what the first did (warm pool ranks carry
    # whatever earlier tasks left in those streams), and a resume at another step other values.
    flags = dict(global_batch_size=12, ckpt_every=2)
    draws = {}
    for step in (2, 4):  # a resume later in the run draws on, not the streams of an earlier one
        out = str(tmp_path / f"stopped_at_{step}")
        spawn(fit_seeded, out, world_size=saved_at, stop_after=step, **flags)
        draws[step] = spawn(host_draws_after_resume, out, world_size=resumed_at, **flags)
        again = spawn(host_draws_after_resume, out, world_size=resumed_at, **flags)
        assert draws[step] == again
        for stream in range(3):  # Python's, numpy's, torch's
            assert len({rank[stream] for rank in draws[step]}) == resumed_at, (stream, draws[step])
    for at_2, at_4 in zip(draws[2], draws[4], strict=True):
        assert all(a != b for a, b in zip(at_2, at_4, strict=True)), (at_2, at_4)


def test_eval_counts_every_sample_once_at_any_world_size(spawn):
    model = build_model(tiny_config("unused"))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    per_size = {n: spawn(eval_model, weights, world_size=n) for n in (1, 2, 3)}
    reference = per_size[1][0]
    assert reference["num_samples"] == 37, "an odd validation size, no padding duplicates"
    for results in per_size.values():
        for metrics in results:
            assert metrics["num_samples"] == 37
            assert metrics["val_acc"] == reference["val_acc"]
            assert metrics["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-12)


def test_ranks_with_different_dataset_sizes_fail_clearly_not_hang(spawn, tmp_path):
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), data="tests.user_code:rank_dependent_datasets", timeout=60)
    assert not isinstance(info.value, RankTimeout)
    for text in info.value.failures.values():
        assert (
            "ConfigError: data: ranks see different training set sizes (10 to 12 steps per epoch)"
            in text
        )


def test_fp16_scaler_state_survives_checkpoint_and_resume(spawn, tmp_path):
    flags = dict(amp="fp16", dtype="float32", model="tests.user_code:spiky_mlp", epochs=1)
    stopped = spawn(fit, str(tmp_path), stop_after=6, **flags)
    assert stopped[0]["scale"] == 65536.0 * 0.5**2, "steps 3 and 6 overflowed"
    saved = torch.load(tmp_path / "checkpoints" / LATEST, weights_only=True)
    assert saved["scaler_state_dict"]["scale"] == stopped[0]["scale"]
    assert spawn(scale_after_resume, str(tmp_path), **flags) == [stopped[0]["scale"]] * 2


def test_nonfinite_loss_stop_policy_stops_every_rank_with_a_clear_message(spawn, tmp_path):
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), data="tests.user_code:exploding_datasets", on_nonfinite="stop")
    assert set(info.value.failures) == {0, 1}, "every rank stops, none is left waiting"
    for text in info.value.failures.values():
        assert re.search(r"NonFiniteStep: step \d+: non-finite loss on [12] of 2 rank\(s\); "
                         "stopping every rank", text)


def test_config_error_inside_a_rank_is_a_config_error(spawn, tmp_path):
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), train_size=4, batch_size=4, world_size=2)
    assert "do not fill one global batch of 8" in info.value.failures[0]
    assert ConfigError.__name__ in info.value.failures[0]


def test_each_step_is_evaluated_once_when_eval_every_divides_max_steps(spawn, tmp_path):
    spawn(fit, str(tmp_path), max_steps=8, eval_every=4, epochs=5)
    import json

    history = [json.loads(ln) for ln in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [4, 8]
    assert all(h["samples_per_s"] > 0 for h in history)


@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_gradient_clipping_bounds_the_true_gradient_under_amp(spawn, tmp_path, amp):
    # Plain SGD with lr 1: one clipped step moves the weights by exactly grad_clip. Clipping the
    # fp16-scaled gradient without unscaling first would move them 65536 times less.
    moved = spawn(
        first_update_norm,
        str(tmp_path),
        world_size=1,
        amp=amp,
        dtype="float32",
        optimizer="sgd",
        momentum=0.0,
        lr=1.0,
        lr_schedule="constant",
        grad_clip=0.01,
        max_steps=1,
        epochs=1,
    )[0]
    assert moved == pytest.approx(0.01, rel=1e-3)


@pytest.mark.parametrize("grad_accum", [1, 3])
@pytest.mark.parametrize(("stop_check_s", "agreements"), [(0, 1), (3600, 0)])
def test_gradients_are_all_reduced_once_per_optimizer_step_whatever_the_accumulation(
    spawn, tmp_path, grad_accum, stop_check_s, agreements
):
    # The tiny MLP fits in one DDP bucket: one all-reduce per synced backward. Syncing every
    # micro-batch would give the same weights (the mean of means): only the count shows it.
    # (DDP rebuilds its buckets once, at the second step's forward, with two broadcasts.) The
    # step's agreement is one more where the stop is checked every step; a per-sample loss with
    # nothing to log and a check every hour needs none after the first two.
    counted = spawn(count_step_collectives, str(tmp_path), grad_accum=grad_accum, max_steps=5,
                    epochs=2, stop_check_s=stop_check_s)  # fmt: skip
    for rank in counted:
        assert rank["steps"] == 5
        assert rank["collectives"][2:] == [1 + agreements] * 3, counted


@pytest.mark.parametrize("amp, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_runs_the_forward_in_half_precision(spawn, tmp_path, amp, dtype):
    # Finite weights or "close to fp32" would also hold if autocast were a no-op: look at the
    # dtype the trainer's forward (and evaluation) actually computed in.
    seen = spawn(autocast_dtypes_seen, str(tmp_path), amp=amp, dtype="float32", max_steps=2)
    assert seen == [{dtype}, {dtype}]


def test_after_fit_every_rank_holds_the_saved_parameters_and_buffers(spawn, tmp_path):
    # Batch norm statistics drift per rank during training (DDP re-broadcasts rank 0's only at
    # the next forward); stopping mid-epoch saves without evaluating: the save must sync them.
    ranks = spawn(fit, str(tmp_path), model="convnet", stop_after=3)
    saved = torch.load(tmp_path / "checkpoints" / LATEST, weights_only=True)["model_state_dict"]
    assert any("running_mean" in key for key in saved)
    for rank in ranks:
        assert_same_weights(rank["weights"], saved)
