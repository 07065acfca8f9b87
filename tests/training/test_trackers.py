"""``--log-to tensorboard,wandb``: the run's curves where users watch them, read back with each
tracker's own reader; a resumed or restarted run continues them without duplicate or missing
points; the training loss reaches rank 0 with the next step's agreement (no collective or host
read of its own)."""

import json
import math

import pytest

from refddp.training.trackers.jsonl import strict_json
from tests.cli_runs import run, train_command
from tests.observability_tasks import fit_with_recording_tracker
from tests.tracker_files import history, tensorboard_scalars, wandb_curves, wandb_segments

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
pytest.importorskip("wandb", reason="the wandb extra is not installed")

# 96 samples, 2 ranks x 4: 12 steps per epoch, 24 in all; an evaluation every 4 steps.
JOB = ["--nproc", 2, "--train-size", 96, "--val-size", 37, "--input-dim", 8, "--hidden-size",
       16, "--batch-size", 4, "--epochs", 2, "--dtype", "float64", "--deterministic",
       "--device", "cpu", "--log-to", "tensorboard,wandb", "--log-every", 1, "--eval-every", 4]  # fmt: skip
STEPS = list(range(1, 25))


def train(out, *args, env=None):
    done = run(train_command(out, *JOB, *args), env={"WANDB_MODE": "offline", **(env or {})})
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    train(out)
    return out


def steps(points):
    return [step for step, _ in points]


@pytest.mark.slow  # with its module's whole run: ~26 s
def test_tensorboard_and_wandb_show_the_runs_curves(straight):
    records = history(straight)
    evaluated = [r["step"] for r in records]
    assert evaluated == [4, 8, 12, 16, 20, 24]
    board = tensorboard_scalars(straight)
    segments = wandb_segments(straight)
    assert len(segments) == 1
    for curves in (board, wandb_curves(segments)):
        assert steps(curves["train/loss"]) == steps(curves["train/lr"]) == STEPS
        assert steps(curves["val/loss"]) == steps(curves["perf/samples_per_s"]) == evaluated
        for record, (_, val_loss), (_, val_acc) in zip(records, curves["val/loss"],
                                                       curves["val/acc"], strict=True):  # fmt: skip
            assert val_loss == pytest.approx(record["val_loss"], rel=1e-6)
            assert val_acc == pytest.approx(record["val_acc"], rel=1e-6)
        # Every step has the global batch's 8 targets: the mean of the per-step losses over an
        # evaluation's window is the record's train_loss, which every rank's sums make. A rank's
        # own loss would not average to it.
        losses = dict(curves["train/loss"])
        for record in records:
            window = [losses[s] for s in range(record["step"] - 3, record["step"] + 1)]
            assert sum(window) / 4 == pytest.approx(record["train_loss"], rel=1e-5)
        assert curves["train/lr"][0][1] == pytest.approx(3e-3)  # the peak, then the cosine
        assert curves["train/lr"][-1][1] < curves["train/lr"][0][1]


@pytest.mark.slow  # CLI runs: ~40 s
@pytest.mark.slow  # two more runs with W&B's start-up: ~30 s under this machine's load
def test_a_run_resumed_from_an_earlier_checkpoint_continues_the_curves_once(tmp_path, straight):
    out = tmp_path / "run"
    train(out, "--stop-after", 10, "--ckpt-every", 4)  # checkpoints at 4, 8 and 10
    # As after a kill at step 10 with the last checkpoint at 8: steps 9 and 10 were logged,
    # and the resumed run logs them again.
    train(out, "--resume", out / "checkpoints" / "checkpoint_previous.pth")
    board, wanted = tensorboard_scalars(out), tensorboard_scalars(straight)
    assert steps(board["train/loss"]) == STEPS, "TensorBoard hides what was logged after 8"
    assert board["train/loss"] == wanted["train/loss"], "exact resume: the same losses"
    assert steps(board["val/loss"]) == steps(wanted["val/loss"])
    segments = wandb_segments(out)
    assert len(segments) == 2
    assert segments[0]["run_id"] == segments[1]["run_id"], "one W&B run across invocations"
    assert steps(wandb_curves(segments)["train/loss"]) == STEPS
    assert wandb_curves(segments)["train/loss"] == wandb_curves(wandb_segments(straight))["train/loss"]
    assert [r["step"] for r in history(out)] == [r["step"] for r in history(straight)]


@pytest.mark.slow  # a SIGKILL, the elastic agent's restart, and the rerun: ~25-55 s here
def test_a_killed_rank_0_loses_no_point_logged_before_its_last_checkpoint(tmp_path, straight):
    # Rank 0 (the trackers' rank) is SIGKILLed in step 9; the restart resumes from step 8.
    # Steps 1-8 were held by the tracker (no evaluation before 12, fewer than a batch) until
    # the flush before step 8's checkpoint gave them to the writer and waited for it: without
    # that flush the kill would take them along.
    out = tmp_path / "killed"
    done = train(out, "--ckpt-every", 4, "--eval-every", 12, "--max-restarts", 1, "--model",
                 "tests.user_code:killed_mlp", "--log-to", "tensorboard",
                 env={"REFDDP_TEST_KILL_AT": "9", "REFDDP_TEST_KILL_RANK": "0"})  # fmt: skip
    assert "at epoch 0, step 8" in done.stderr
    board = tensorboard_scalars(out)
    assert steps(board["train/loss"]) == STEPS
    assert board["train/loss"] == tensorboard_scalars(straight)["train/loss"]


@pytest.mark.parametrize("log_every", [3, 4])
def test_the_training_loss_reaches_the_trackers_with_the_next_steps_agreement(
    spawn, tmp_path, log_every
):
    # log_every 3 logs step 3 at step 4's agreement; 4 logs steps that end an evaluation
    # window (6 does not divide 4: 12 and 24 do), agreed by the settle before the evaluation.
    # No stop check after the first two steps: step 4 meets for step 3's loss alone.
    found = spawn(fit_with_recording_tracker, str(tmp_path / str(log_every)),
                  log_every=log_every, eval_every=6, stop_check_s=3600)  # fmt: skip
    rank0, rank1 = found
    assert [step for step, _ in rank0["points"]] == list(range(log_every, 25, log_every))
    losses = [scalars["train/loss"] for _, scalars in rank0["points"]]
    assert all(0 < loss < 10 for loss in losses), f"every rank's loss summed, read back: {losses}"
    assert rank1["points"] == rank1["records"] == [], "the other ranks hold no tracker"
    assert [r["step"] for r in rank0["records"]] == [6, 12, 18, 24]
    events = rank0["events"]
    assert events[0] == "open at step 0" and events[-1] == "close"
    flushes = [i for i, event in enumerate(events) if event == "flush"]
    # one per checkpoint (every 6 steps), and one just before the close, as every tracker is
    # flushed before any closes
    assert len(flushes) == len(rank0["records"]) + 1 and flushes[-1] == len(events) - 2, events
    # A step's point reaches the tracker before the checkpoint after it is flushed: a run
    # killed after that checkpoint keeps it.
    for step, _ in rank0["points"]:
        checkpoint = (step + 5) // 6 - 1  # the first at or after the step
        assert events.index(f"log {step}") < flushes[checkpoint], (step, events)


@pytest.mark.parametrize(
    ("flags", "steps_logged"),
    [
        # 5 steps in a row skipped as non-finite: the run stops at step 5 (exit 1)
        (["--loss", "tests.user_code:nan_gradient_every_step_loss", "--max-consecutive-skips", 5],
         list(range(1, 6))),
        # every step trains; the final evaluation is non-finite (exit 1 after the done: line)
        (["--data", "tests.user_code:nonfinite_val_datasets", "--max-steps", 8], STEPS[:8]),
    ],
    ids=["skips", "final-evaluation"],
)
def test_a_failed_run_closes_its_trackers_with_every_point_and_w_and_b_marks_it_failed(
    tmp_path, flags, steps_logged
):
    done = run(train_command(tmp_path, *JOB, *flags), env={"WANDB_MODE": "offline"})
    assert done.returncode == 1, done.stderr
    # TensorBoard held the last steps (10 at a time): closing hands them to its file.
    assert logged_steps(tensorboard_scalars(tmp_path)) == steps_logged
    [segment] = wandb_segments(tmp_path)
    assert segment["exit_code"] == 1, "left open, wandb's exit handler finished the run with 0"
    assert logged_steps(wandb_curves([segment])) == steps_logged


def logged_steps(curves):
    """The steps any curve has a point at (a stopped step's loss, agreed a step late, has none:
    its skip count has)."""
    return sorted({step for points in curves.values() for step in steps(points)})


def test_history_and_eval_json_write_non_finite_numbers_as_null():
    # Python's NaN and Infinity are not JSON: jq reads them, most other parsers refuse them.
    record = {"val_loss": math.nan, "train_loss": 0.5, "ranks": [math.inf, 1.0],
              "inner": {"x": -math.inf}, "step": 3}  # fmt: skip
    text = strict_json(record)
    assert json.loads(text) == {"val_loss": None, "train_loss": 0.5, "ranks": [None, 1.0],
                                "inner": {"x": None}, "step": 3}  # fmt: skip
    assert "NaN" not in strict_json(record, indent=2) and "Infinity" not in text
