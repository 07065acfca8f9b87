"""``--strategy fsdp`` through the real CLI: the same run as DDP, the same checkpoint contract.

FSDP2 shards parameters, gradients and optimizer state; everything else a run promises must
not change: float64 weights equal DDP's within rounding, checkpoints are plain full dicts that
a bare model loads, and a run resumes across strategies and world sizes.
"""

import signal

import pytest
import torch

import refddp
from refddp.checkpoints import dcp as checkpoint_dcp
from refddp.checkpoints.full import LATEST
from tests.checkpoints.test_resume import assert_same_weights, only_error_line
from tests.rank_tasks import (
    fit_counting_compiled_graphs,
    fit_full_weights,
    fit_signalled_after_step,
)
from tests.torch_features import needs_fsdp2

pytestmark = needs_fsdp2

STEPS_CLOSE = {"rtol": 1e-9, "atol": 1e-12}  # float64: reduction order only


@pytest.mark.slow  # two CLI runs: ~25 s
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fsdp_run_equals_the_ddp_run_with_accumulation_and_clipping(run_cli, tiny, optimizer):
    # val_size 33 at 2 ranks x batch 8: shards of 17 and 16, 3 and 2 forwards (lockstep pads).
    flags = {**tiny, "optimizer": optimizer, "grad_accum": 2, "grad_clip": 0.5, "val_size": 33}
    ddp = run_cli("--nproc", 2, out="ddp", **flags)
    fsdp = run_cli("--nproc", 2, "--strategy", "fsdp", out="fsdp", **flags)
    assert_same_weights(fsdp.weights(), ddp.weights(), **STEPS_CLOSE)
    # The optimizer state too, in the same layout (torch's: parameter indices, not names).
    ours_opt = fsdp.checkpoint()["optimizer_state_dict"]
    theirs_opt = ddp.checkpoint()["optimizer_state_dict"]
    assert ours_opt["param_groups"][0]["params"] == theirs_opt["param_groups"][0]["params"]
    assert ours_opt["state"].keys() == theirs_opt["state"].keys()
    for index, state in theirs_opt["state"].items():
        assert_same_weights(ours_opt["state"][index], state, **STEPS_CLOSE)
    # Exact eval with FSDP's lockstep forwards over uneven shards: the same metrics.
    ours, theirs = fsdp.checkpoint()["metrics"], ddp.checkpoint()["metrics"]
    assert ours["num_samples"] == theirs["num_samples"] == 33
    assert ours["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-9)


def test_fsdp_checkpoint_is_a_plain_full_dict_a_bare_model_evaluates(run_cli, tiny):
    run = run_cli("--nproc", 2, "--strategy", "fsdp", out="fsdp", **tiny)
    state = torch.load(run.out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    model = refddp.build_model(state["config"])
    model.load_state_dict(state["model_state_dict"])  # strict: full, clean keys
    _, val = refddp.build_datasets(state["config"])
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.tensor([int(val[i][1]) for i in range(len(val))])
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x), y).item()
    assert loss == pytest.approx(state["metrics"]["val_loss"], rel=1e-9)
    # The optimizer state is in torch's own layout: a plain optimizer loads it.
    torch.optim.AdamW(model.parameters()).load_state_dict(state["optimizer_state_dict"])


@pytest.mark.slow  # six CLI runs: ~70 s
def test_a_run_resumes_across_strategies_and_world_sizes(run_cli, tiny):
    # Global batch 24 divides by 1, 2 and 3 ranks: 4 steps per epoch, 8 in all.
    flags = {**{k: v for k, v in tiny.items() if k != "batch_size"}, "global_batch_size": 24}
    straight = run_cli("--nproc", 2, out="straight", **flags)
    hops = [("ddp", 2), ("fsdp", 2), ("fsdp", 3), ("ddp", 1)]  # DDP -> FSDP, 2 -> 3, FSDP -> DDP
    for i, (strategy, nproc) in enumerate(hops):
        stop = ["--stop-after", 2] if i < len(hops) - 1 else []
        last = run_cli("--nproc", nproc, "--strategy", strategy, *stop, out="hops", **flags)
        assert last.checkpoint()["step"] == 2 * (i + 1), last.stderr
    assert_same_weights(last.weights(), straight.weights(), **STEPS_CLOSE)


@pytest.mark.slow  # CLI runs: ~45 s
def test_fsdp_starts_from_rank0_weights_like_ddp(run_cli, tiny):
    # init_from weights are read by rank 0 only: FSDP must hand them to every rank, as DDP does.
    source = run_cli("--nproc", 1, "--seed", 5, out="source", **tiny)
    init = str(source.out / "checkpoints" / "checkpoint_latest.pth")
    ddp = run_cli("--nproc", 2, "--init-from", init, out="ddp", **tiny)
    fsdp = run_cli("--nproc", 2, "--strategy", "fsdp", "--init-from", init, out="fsdp", **tiny)
    assert_same_weights(fsdp.weights(), ddp.weights(), **STEPS_CLOSE)


def test_fsdp_with_fp16_is_refused_in_one_line(run_cli, tiny):
    flags = {**tiny, "dtype": "float32"}
    run = run_cli("--nproc", 2, "--strategy", "fsdp", "--amp", "fp16", out="x", check=False, **flags)
    assert run.returncode == 2
    assert "fp16" in only_error_line(run.stderr) and "fsdp" in run.stderr


def test_sigterm_to_one_fsdp_rank_stops_every_rank_at_the_same_step_and_resumes_exactly(
    spawn, tmp_path
):
    flags = dict(strategy="fsdp", ckpt_format="dcp")
    straight = spawn(fit_full_weights, str(tmp_path / "straight"), **flags)[0]
    out = str(tmp_path / "run")
    # Rank 1 alone, after step 5; the stop checked every step.
    stopped = spawn(fit_signalled_after_step, out, 5, 1, stop_check_s=0, **flags)
    assert [(r["step"], r["stopped_by"]) for r in stopped] == [(6, signal.SIGTERM)] * 2
    resumed = spawn(fit_full_weights, out, **flags)[0]
    assert resumed["step"] == straight["step"] == 24
    assert_same_weights(resumed["weights"], straight["weights"])  # bit for bit


@pytest.mark.slow  # an elastic restart: ~25 s alone, ~60 s on a loaded 2-core machine
def test_a_sigkilled_fsdp_rank_is_restarted_from_its_dcp_checkpoint_bit_identically(run_cli, tiny):
    flags = {**tiny, "epochs": 3, "ckpt_every": 4, "strategy": "fsdp"}  # 6 steps per epoch
    straight = run_cli("--nproc", 2, out="straight", **flags)
    killed = run_cli("--nproc", 2, "--max-restarts", 1, "--model", "tests.user_code:killed_mlp",
                     "--ckpt-format", "dcp", out="killed", env={"REFDDP_TEST_KILL_AT": "11"},
                     **flags)  # fmt: skip
    # Killed during step 11: the restarted ranks resume from the dcp checkpoint of step 8.
    assert "resumed from" in killed.stderr and "at epoch 1, step 8" in killed.stderr
    latest = killed.out / "checkpoints" / checkpoint_dcp.LATEST
    state = checkpoint_dcp.load_full(checkpoint_dcp.load_run_state(str(latest)))
    assert state["step"] == 18
    assert_same_weights(state["model_state_dict"], straight.weights())  # bit for bit


# inductor compiles each FSDP unit, or DDP's graph split at buckets: 20-65 s under -n 2 (its
# compile workers load every core, hence heavy: never beside another heavy test)
@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_torch_compile_trains_like_eager(spawn, tmp_path, strategy):
    # Under DDP the compiled module is torch.compile around DDP around the user's model.
    flags = dict(strategy=strategy, epochs=1)
    eager = spawn(fit_counting_compiled_graphs, str(tmp_path / "eager"), **flags)[0]
    compiled = spawn(fit_counting_compiled_graphs, str(tmp_path / "compiled"), compile=True,
                     timeout=240, **flags)[0]  # fmt: skip
    assert eager["graphs"] == 0 and compiled["graphs"] > 0
    assert_same_weights(compiled["weights"], eager["weights"], **STEPS_CLOSE)


@pytest.mark.parametrize("ckpt_format", ["full", "dcp"])
def test_a_save_before_the_first_applied_step_changes_nothing(spawn, tmp_path, ckpt_format):
    # Step 1's loss is inf and skipped, so the saves at step 1 find an optimizer without state.
    # torch's state-dict API would create it with a real AdamW step (lr 0): step count 1.
    flags = dict(strategy="fsdp", data="tests.user_code:first_step_explodes_datasets",
                 on_nonfinite="skip", epochs=1, ckpt_format=ckpt_format)  # fmt: skip
    straight = spawn(fit_full_weights, str(tmp_path / "a"), world_size=2, **flags)[0]
    saving = spawn(fit_full_weights, str(tmp_path / "b"), world_size=2, ckpt_every=1,
                   **flags)[0]  # fmt: skip
    out = tmp_path / "c"
    assert spawn(fit_full_weights, str(out), world_size=2, stop_after=1, **flags)[0]["step"] == 1
    resumed = spawn(fit_full_weights, str(out), world_size=2, **flags)[0]
    latest = checkpoint_dcp.LATEST if ckpt_format == "dcp" else LATEST
    assert resumed["resumed_from"] == str(out / "checkpoints" / latest)
    for run in (saving, resumed):
        assert run["step"] == straight["step"] == 12
        assert_same_weights(run["weights"], straight["weights"])
        assert run["optimizer"]["state"][0]["step"] == straight["optimizer"]["state"][0]["step"]
        assert_same_weights(run["optimizer"]["state"], straight["optimizer"]["state"])
