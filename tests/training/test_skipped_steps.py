"""A step skipped as non-finite leaves no trace, is on the record, and a run that trains nothing
ends in failure (``refddp/training/skips.py``).

The issue's cases, as a user met them: a BatchNorm model on data where one row in twenty is inf
(its skipped steps used to leave non-finite running statistics, a nan val_loss and exit 0); a
loss whose gradient is NaN at every step under amp fp16 (GradScaler used to skip every step as
an overflow and the run to exit 0 having trained nothing); a parameter DDP ignores whose
gradient is NaN on one rank (that rank alone used to take the non-finite branch, and gloo to
abort the job on its extra collective).
"""

import json
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refddp.config.schema import TrainConfig
from refddp.testing import RankFailure
from refddp.training.skips import run_ends, trained_nothing
from tests import tracker_files
from tests.cli_runs import error_lines
from tests.observability_tasks import fit_with_recording_tracker
from tests.rank_tasks import TOKENS, fit, fit_full_weights
from tests.step_tasks import (
    fit_checking_skipped_steps,
    fit_counting_host_reads,
    fit_from_seeded_host_rngs,
    fit_recording_fetches,
    fit_recording_gradients,
    fit_until_a_batch_fails,
    parallel_refusal,
    reduced_as_ddp_does,
)
from tests.torch_features import needs_fsdp2

EXPLODING = "tests.user_code:exploding_datasets"  # one training row in twenty is inf
NAN_EVERY_STEP = "tests.user_code:nan_gradient_every_step_loss"
EXPERT = "tests.user_code:expert_mlp"  # a parameter DDP ignores, NaN on rank 1 at forward 3


def history(out) -> tuple[list[dict], list[dict]]:
    """history.jsonl's evaluations and skipped steps (read as strict JSON)."""
    lines = tracker_files.history(out)
    return [r for r in lines if "skipped" not in r], [r for r in lines if "skipped" in r]


def test_a_batchnorm_run_on_exploding_data_ends_usable_with_its_skips_on_the_record(
    run_cli, tiny
):
    done = run_cli("--nproc", 2, "--model", "convnet", "--data", EXPLODING, **tiny)
    state = done.checkpoint()
    statistics = {k: v for k, v in state["model_state_dict"].items() if "running_" in k}
    assert len(statistics) == 4, statistics.keys()  # two BatchNorm layers' mean and variance
    for key, value in statistics.items():
        assert torch.isfinite(value).all(), key
    evaluations, skips = history(done.out)
    assert skips, "some steps' loss was inf"
    assert all(math.isfinite(r["val_loss"]) for r in evaluations), evaluations
    assert [r["step"] for r in skips] == sorted({r["step"] for r in skips}), "once each"
    for record in skips:
        assert re.fullmatch(r"non-finite loss on [12] of 2 rank\(s\)", record["skipped"]), record
    assert [r["skipped_steps"] for r in skips] == list(range(1, len(skips) + 1))
    assert state["skipped_steps"] == evaluations[-1]["skipped_steps"] == len(skips)
    done_line = re.search(r"done: step 12, val_loss (\S+), .*, (\d+) step\(s\) skipped as "
                          r"non-finite", done.stderr)  # fmt: skip
    assert done_line and math.isfinite(float(done_line[1].rstrip(","))), done.stderr
    assert int(done_line[2]) == len(skips)


@pytest.mark.parametrize(
    ("model", "overrides"),
    [
        ("convnet", {}),  # BatchNorm's running statistics and batch count
        pytest.param("convnet", {"strategy": "fsdp"}, marks=needs_fsdp2),
        pytest.param("convnet", {"strategy": "fsdp", "dtype": "float32", "amp": "bf16"},
                     marks=needs_fsdp2),  # float32 norms
        ("convnet", {"dtype": "float32", "amp": "bf16"}),
        ("convnet", {"dtype": "float32", "amp": "fp16"}),
        ("convnet", {"dropout": 0.3, "grad_accum": 2, "grad_clip": 0.5}),
    ],
    ids=["ddp", "fsdp", "fsdp-bf16", "bf16", "fp16", "dropout-accumulation"],
)
def test_a_skipped_step_leaves_the_model_optimizer_and_schedule_as_they_were(
    spawn, tmp_path, model, overrides
):
    ranks = spawn(fit_checking_skipped_steps, str(tmp_path), model=model, data=EXPLODING,
                  optimizer="adamw", warmup_steps=3, **overrides)  # fmt: skip
    for rank, found in enumerate(ranks):
        assert found["checked"], "some steps were skipped"
        assert found["changed"] == {}, f"rank {rank}: a skipped step changed {found['changed']}"
        assert found["checked"] == ranks[0]["checked"], "every rank skipped the same steps"
    for key, value in ranks[0]["weights"].items():
        if overrides.get("strategy") != "fsdp":  # (FSDP ranks hold different shards)
            assert torch.equal(value, ranks[1]["weights"][key]), key


def test_skips_continue_across_a_resume_and_reach_the_trackers(spawn, tmp_path):
    job = dict(data=EXPLODING, global_batch_size=8)
    straight_run = spawn(fit, str(tmp_path / "a"), **job)[0]
    straight, straight_weights = straight_run["result"], straight_run["weights"]
    assert straight["skipped_steps"] > 1
    out = tmp_path / "b"
    spawn(fit, str(out), stop_after=13, **job)
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert 0 < state["skipped_steps"] < straight["skipped_steps"], "skips both sides of step 13"
    resumed = spawn(fit, str(out), **job)[0]
    assert resumed["result"]["skipped_steps"] == straight["skipped_steps"], "counted on"
    for key, value in straight_weights.items():  # the schedule counted updates, not steps
        assert torch.equal(resumed["weights"][key], value), key
    evaluations, skips = history(out)
    assert len(skips) == straight["skipped_steps"], "each skipped step on the record once"
    tracked = spawn(fit_with_recording_tracker, str(tmp_path / "c"), **job)[0]
    counts = [(step, s["train/skipped_steps"]) for step, s in tracked["points"]
              if "train/skipped_steps" in s]  # fmt: skip
    assert [n for _, n in counts] == list(range(1, straight["skipped_steps"] + 1))
    assert tracked["records"][-1]["skipped_steps"] == straight["skipped_steps"]


@pytest.mark.parametrize("mode", ["skip", "stop"])
def test_an_fp16_run_whose_gradient_is_nan_at_every_scale_ends_in_one_line_exit_1(
    run_cli, tiny, mode
):
    flags = {**tiny, "dtype": "float32", "amp": "fp16", "loss": NAN_EVERY_STEP,
             "on_nonfinite": mode, "epochs": 4}  # 24 steps  # fmt: skip
    done = run_cli("--nproc", 2, check=False, **flags)
    assert done.returncode == 1, done.stderr
    errors = error_lines(done.stderr)
    # GradScaler halves 65536 at each overflow: below 1 at the 17th.
    assert errors == [
        "error: step 17: fp16 gradient overflow (loss scale 1 -> 0.5), in net.0.weight, "
        "net.0.bias, net.2.weight and 3 more; stopping every rank (the fp16 loss scale fell "
        "below min_loss_scale 1: the gradient is non-finite at every scale (a NaN, not an "
        "overflow))"
    ], done.stderr
    assert "done:" not in done.stderr
    _, skips = history(done.out)
    assert [r["step"] for r in skips] == list(range(1, 18))


def test_a_run_that_skips_every_step_ends_at_the_consecutive_limit_in_one_line_exit_1(
    run_cli, tiny
):
    done = run_cli("--nproc", 2, "--loss", NAN_EVERY_STEP, "--max-consecutive-skips", 5,
                   check=False, **tiny)  # fmt: skip
    assert done.returncode == 1, done.stderr
    errors = error_lines(done.stderr)
    assert errors == [
        "error: step 5: non-finite gradient (norm nan) behind a finite loss on every rank, in "
        "net.0.weight, net.0.bias, net.2.weight and 3 more; stopping every rank (5 steps in a "
        "row skipped (max_consecutive_skips 5): the run trains nothing)"
    ], done.stderr


def test_a_run_shorter_than_the_limit_that_skips_every_step_ends_in_one_line_exit_1(
    run_cli, tiny
):
    # 12 steps, under the default limit of 20: it used to say "done" and exit 0.
    done = run_cli("--nproc", 2, "--loss", NAN_EVERY_STEP, check=False, **tiny)
    assert done.returncode == 1, done.stderr
    errors = error_lines(done.stderr)
    assert errors == [
        "error: step 12: the run has ended and all 12 of its steps were skipped as non-finite "
        "(history.jsonl says why): it trained nothing"
    ], done.stderr
    assert "done:" not in done.stderr
    evaluations, skips = history(done.out)
    assert [r["step"] for r in skips] == list(range(1, 13))
    # It fails at its end: after the final evaluation and checkpoint, as a finished run.
    assert evaluations[-1]["step"] == 12 and done.checkpoint()["step"] == 12, evaluations


def test_a_resumed_run_that_skipped_every_step_before_and_after_the_stop_ends_exit_1(
    run_cli, tiny
):
    flags = {**tiny, "loss": NAN_EVERY_STEP, "nproc": 2}
    run_cli("--stop-after", 5, **flags)  # skips 1-5, under every limit: a stop, exit 0
    shorter = run_cli("--max-steps", 5, check=False, **flags)  # at its end already
    assert shorter.returncode == 1, shorter.stderr
    assert "step 5: the run has ended and all 5 of its steps were skipped" in shorter.stderr
    # (--max-steps 5 was recorded with the evaluation at its end: 0 lifts it)
    done = run_cli("--max-steps", 0, check=False, **flags)  # skips 6-12: 7 here, 12 in the run
    assert done.returncode == 1, done.stderr
    assert "step 12: the run has ended and all 12 of its steps were skipped" in done.stderr


def test_a_run_that_trained_before_its_last_steps_were_skipped_ends_exit_0(run_cli, tiny):
    done = run_cli("--nproc", 2, "--loss", "tests.user_code:nan_gradient_from_step_7_loss",
                   **tiny)  # fmt: skip
    evaluations, skips = history(done.out)
    assert [r["step"] for r in skips] == list(range(7, 13)), skips
    assert math.isfinite(evaluations[-1]["val_loss"]), evaluations
    assert "6 step(s) skipped as non-finite" in done.stderr


@settings(max_examples=300, deadline=None)
@given(applied=st.lists(st.booleans(), min_size=1, max_size=40), limit=st.integers(0, 12))
def test_a_run_ends_in_failure_exactly_when_a_streak_reaches_the_limit_or_nothing_trained(
    applied, limit
):
    """Over every pattern of applied and skipped steps and any limit (0: none), with the counts
    ``refddp/training/steps.py`` keeps: the run fails at the first skip that completes a streak
    of ``limit``, else at its end if no step was applied, else never. (The counts crossing a
    resume: ``test_a_resumed_run_that_skipped_every_step_before_and_after_the_stop_ends_exit_1``.)"""
    c = TrainConfig(max_consecutive_skips=limit)
    in_a_row, failed_at = 0, None
    for step, ok in enumerate(applied, start=1):
        in_a_row = 0 if ok else in_a_row + 1
        if not ok and run_ends(c, in_a_row, None):
            failed_at = step
            break
    if failed_at is None and trained_nothing(len(applied), in_a_row):
        failed_at = len(applied)
    streak = [False] * limit
    reached = [s for s in range(limit, len(applied) + 1)
               if limit and applied[s - limit:s] == streak]  # fmt: skip
    assert failed_at == (reached[0] if reached else None if any(applied) else len(applied))


def test_the_consecutive_limit_counts_skips_in_a_row_only(spawn, tmp_path):
    job = dict(data=EXPLODING, global_batch_size=8)
    straight = spawn(fit_checking_skipped_steps, str(tmp_path / "a"), **job)[0]
    steps = straight["checked"]  # the skipped steps
    longest = max(len(run) for run in runs_of_consecutive(steps))
    assert len(steps) > longest, "skips apart from each other, to count separately"
    limited = spawn(fit, str(tmp_path / "b"), max_consecutive_skips=longest + 1, **job)[0]
    assert limited["step"] == straight["result"]["step"], "the run goes on to its end"
    with pytest.raises(RankFailure, match=f"max_consecutive_skips {longest}"):
        spawn(fit, str(tmp_path / "c"), max_consecutive_skips=longest, **job)


def runs_of_consecutive(steps: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for step in steps:
        if runs and runs[-1][-1] == step - 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs


def test_a_run_whose_final_evaluation_is_non_finite_says_so_and_exits_1(run_cli, tiny):
    done = run_cli("--nproc", 2, "--data", "tests.user_code:nonfinite_val_datasets",
                   check=False, **tiny)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert re.search(r"done: step 12, val_loss (nan|inf), .*; the final evaluation is non-finite",
                     done.stderr), done.stderr  # fmt: skip
    assert done.stderr.count("done: step 12") == 1, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "step 12: the final evaluation is non-finite" in errors[0]
    evaluations, _ = history(done.out)  # strict JSON: the non-finite loss is null
    assert evaluations[-1]["step"] == 12 and evaluations[-1]["val_loss"] is None, evaluations
    # Evaluating that checkpoint on the same data fails alike (it exited 0), eval.json kept.
    evaluated = run_cli("--nproc", 2, "--task", "eval", "--data",
                        "tests.user_code:nonfinite_val_datasets", check=False,
                        **{k: v for k, v in tiny.items() if k in ("device", "dtype")})  # fmt: skip
    assert evaluated.returncode == 1, evaluated.stderr
    errors = error_lines(evaluated.stderr)
    assert len(errors) == 1 and re.search(r"the evaluation of \S+checkpoint_latest.pth is "
                                          r"non-finite \(val_loss (nan|inf)", errors[0]), errors
    assert "; the evaluation is non-finite" in evaluated.stderr, evaluated.stderr
    written = json.loads((done.out / "eval.json").read_text(), parse_constant=pytest.fail)
    assert written["val_loss"] is None, written


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_nan_gradient_on_a_parameter_ddp_ignores_is_skipped_on_every_rank(
    spawn, tmp_path, world_size
):
    # Rank 1's expert gradient is NaN at its third forward; DDP never all-reduces it.
    ranks = spawn(fit_full_weights, str(tmp_path), model=EXPERT, world_size=world_size)
    assert [r["result"]["skipped_steps"] for r in ranks] == [1] * world_size
    assert len({r["step"] for r in ranks}) == 1 and ranks[0]["step"] > 1, "the others train"
    for key, value in ranks[0]["weights"].items():
        assert torch.isfinite(value).all(), key


def test_a_nan_gradient_on_a_parameter_ddp_ignores_stops_every_rank_in_one_line(
    spawn, tmp_path
):
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), model=EXPERT, on_nonfinite="stop")
    assert set(info.value.failures) == {0, 1}, "every rank stops, none is left waiting"
    said = {re.search(r"NonFiniteStep: (step \d+: .*)", text)[1]
            for text in info.value.failures.values()}  # fmt: skip
    # Only rank 1's gradient of the expert is NaN, which DDP ignores: only rank 1 could name it,
    # and every rank says where it was.
    assert said == {"step 3: non-finite gradient (norm nan) behind a finite loss on every rank, "
                    "in the parameters DDP ignores on rank 1; stopping every rank "
                    "(on_nonfinite=stop)"}  # fmt: skip


def test_the_parameters_taken_as_unreduced_are_those_ddp_does_not_reduce(spawn):
    found = spawn(reduced_as_ddp_does)[0]
    assert found["ours"] == found["reduced"]
    assert "expert.weight" not in found["reduced"], "DDP ignored the sub-module's parameter"


def test_fp16_with_a_parameter_ddp_ignores_is_refused_in_one_line(run_cli, spawn, tiny):
    done = run_cli("--nproc", 2, "--model", EXPERT, "--dtype", "float32", "--amp", "fp16",
                   check=False, **{k: v for k, v in tiny.items() if k != "dtype"})  # fmt: skip
    assert done.returncode == 2, done.stderr
    refused = re.fullmatch(r"(.*) \((ranks? [0-9, ]+)\)", done.stderr.strip().splitlines()[-1])
    assert refused, done.stderr
    assert refused[1] == (
        "error: amp: fp16 with parameters DDP ignores (_ddp_params_and_buffers_to_ignore) "
        "would let each rank's GradScaler back off alone on its own gradients; use --amp "
        "bf16 or off"
    )
    # Which ranks had recorded it when torchrun's agent ended the others is timing (on torch
    # < 2.6 a rank the agent ended is not among its failures at all); the harness ends none:
    assert refused[2] in ("ranks 0, 1", "rank 0", "rank 1"), refused[2]
    said = spawn(parallel_refusal, model=EXPERT, dtype="float32", amp="fp16")
    assert said == [refused[1].removeprefix("error: ")] * 2, "every rank refuses, alike"


@pytest.mark.parametrize(
    ("world_size", "overrides"),
    [
        (1, {}),
        (1, {**TOKENS, "log_to": "recording"}),  # its norm and a logged loss: one read
        (2, {}),
        (2, {"dtype": "float32", "amp": "fp16"}),
        (2, {"dtype": "float32", "amp": "bf16", "grad_accum": 2, "grad_clip": 0.5}),
        pytest.param(2, {"strategy": "fsdp"}, marks=needs_fsdp2),
        (2, {**TOKENS, "log_to": "recording"}),  # the step's loss logged a step late too
        (3, {"data": EXPLODING}),  # skipped steps, and DDP's bucket settle before step 1
    ],
    ids=["one-process", "one-process-logging", "ddp", "fp16", "bf16-accumulation-clip", "fsdp", "tokens", "skips"],
)
def test_a_step_reads_from_the_device_once(spawn, tmp_path, world_size, overrides):
    # The one read: the agreement with the gradient's norm. A skipped step (rare) reads one
    # more: its count of non-finite losses, to say why.
    job = {"epochs": 2, "eval_every": 0, "ckpt_every": 0, **overrides}
    for rank, found in enumerate(spawn(fit_counting_host_reads, str(tmp_path),
                                       world_size=world_size, **job)):  # fmt: skip
        reads, skipped = found["reads"], found["skipped"]
        assert len(reads) >= 8, reads
        assert bool(skipped) == (overrides.get("data") == EXPLODING), skipped
        expected = {step: 2 if step in skipped else 1 for step in reads}
        assert reads == expected, f"rank {rank}: reads per step"


@pytest.mark.parametrize("world_size, accumulation", [(1, 1), (2, 2)])
def test_the_next_steps_batches_are_fetched_before_a_step_waits_for_the_device(
    spawn, tmp_path, world_size, accumulation
):
    # The read waits for the backward (on a GPU) or the gradient's all-reduce (gloo); a plain
    # loop's host fetches the next batch meanwhile, and so does refddp's: each step fetches
    # the next step's micro-batches before its read, but where an evaluation follows (an
    # epoch's last step, every eval_every). The watchdog's mark comes just before the fetch.
    for rank, found in enumerate(spawn(fit_recording_fetches, str(tmp_path), world_size=world_size,
                                       grad_accum=accumulation, epochs=2, eval_every=5)):  # fmt: skip
        per_epoch, fetches = found["steps_per_epoch"], ["fetch"] * accumulation
        assert found["steps"] == 2 * per_epoch
        expected = []
        for step in range(1, 2 * per_epoch + 1):
            if step % per_epoch == 1 or per_epoch == 1 or step % 5 == 1:  # fetched at its start
                expected += fetches
            evaluates = step % per_epoch == 0 or step % 5 == 0
            expected += ["progress"] + ([] if evaluates else fetches) + ["read"]
        assert found["events"] == expected, f"rank {rank}"


@pytest.mark.parametrize("overrides", [{"data": EXPLODING}, {"grad_accum": 2, "eval_every": 3}],
                         ids=["skips", "accumulation-evaluations"])
def test_an_applied_steps_gradient_lives_until_the_next_steps_forward(spawn, tmp_path, overrides):
    # Freed at the next step's start, as a plain loop's zero_grad frees it, not at the end of
    # the update: freed there, glibc hands its heap's top back to the kernel between steps
    # and each forward and backward faults it in again (benchmarks/README.md). A skipped
    # step's non-finite gradient goes at once, and fit hands the model back without one.
    job = {"epochs": 2, **overrides}
    for rank, found in enumerate(spawn(fit_recording_gradients, str(tmp_path), world_size=2,
                                       **job)):  # fmt: skip
        after, skipped = found["after_step"], found["skipped"]
        assert len(after) >= 8, after
        assert bool(skipped) == (overrides.get("data") == EXPLODING), skipped
        expected = {step: "freed" if step in skipped else "held" for step in after}
        assert after == expected, f"rank {rank}: after each step"
        # Through the evaluations and saves between steps (every third step, and each epoch's
        # last), until the next step's start: none before the first step, nor after a skip.
        held_before = {step: "held" if step > 1 and step - 1 not in skipped else "freed"
                       for step in after}  # fmt: skip
        assert found["at_start"] == held_before, f"rank {rank}: at each step's start"
        assert set(found["first_forward_found"]) == set(after), f"rank {rank}"
        assert set(found["first_forward_found"].values()) == {"freed"}, f"rank {rank}"
        assert found["after_fit"] == "freed", f"rank {rank}"


def test_an_exact_resume_after_a_batch_fetched_ahead_with_pythons_and_numpys_rngs(spawn, tmp_path):
    # A dataset fetched in the process (--num-workers 0) that draws from Python's and numpy's
    # global RNGs: SIGTERM after step 5 stops every rank after step 6, whose read came after
    # step 7's batches were fetched; the checkpoint holds the states from before that fetch.
    flags = {"data": "tests.user_code:worker_random_datasets", "num_workers": 0, "stop_check_s": 0}
    straight = spawn(fit_from_seeded_host_rngs, str(tmp_path / "straight"), **flags)[0]
    out = str(tmp_path / "run")
    stopped = spawn(fit_from_seeded_host_rngs, out, signalled_after=5, **flags)
    assert [r["step"] for r in stopped] == [6, 6]
    resumed = spawn(fit_full_weights, out, **flags)[0]  # its states: the checkpoint's
    assert resumed["step"] == straight["step"]
    for key, value in straight["weights"].items():
        assert torch.equal(resumed["weights"][key], value), key


def test_a_batch_that_fails_to_load_fails_its_own_step_not_the_step_that_fetched_it(spawn, tmp_path):
    # Step 3's first item is fetched during step 2, before its update: the error waits for
    # step 3, so step 2 still updates, as it did before batches were fetched ahead (that they
    # are fetched ahead is the test above's).
    [found] = spawn(fit_until_a_batch_fails, str(tmp_path), world_size=1, failing_item=2 * 4 + 1)
    assert found["batch_size"] == 4
    assert (found["step"], found["updates"]) == (2, 2)
    assert found["error"] == f"item {found['failing']}: unreadable"
