"""Nothing non-finite reaches the weights: a step whose loss on any rank, or whose all-reduced
gradient, is non-finite is skipped on every rank (or stops every rank), decided from the
gradient's norm, which is the same on every rank after the all-reduce (``refddp/training/steps.py``).

The losses misbehave on one marked training sample (``tests/user_code.py``), so on one rank at
one step: a NaN gradient behind a finite loss (a distance between a vector and its detached
copy), and an infinite loss behind a finite gradient (a target logit masked to -inf).
"""

import math
import re

import pytest
import torch

from refddp.testing import RankFailure
from tests import tracker_files
from tests.cli_runs import error_lines
from tests.rank_tasks import fit, fit_full_weights, fit_recording_scales
from tests.torch_features import FSDP

MARKED = dict(data="tests.user_code:marked_datasets", epochs=1, global_batch_size=8)
NAN_GRADIENT = "tests.user_code:nan_gradient_loss"
INFINITE_LOSS = "tests.user_code:infinite_loss_finite_gradient_loss"


@pytest.mark.parametrize("strategy", ["ddp", FSDP])
@pytest.mark.parametrize("loss", [NAN_GRADIENT, INFINITE_LOSS], ids=["nan-gradient", "inf-loss"])
def test_a_step_non_finite_on_one_rank_is_skipped_on_every_rank_as_one_process_skips_it(
    spawn, tmp_path, loss, strategy
):
    # (FSDP: each rank holds a shard of the gradient; its norm is one all-reduce away. Rank 0
    # gathers the full weights.)
    one = spawn(fit_full_weights, str(tmp_path / "one"), world_size=1, loss=loss, **MARKED)[0]
    two = spawn(fit_full_weights, str(tmp_path / "two"), world_size=2, loss=loss,
                strategy=strategy, **MARKED)  # fmt: skip
    assert [r["result"]["skipped_steps"] for r in [one, *two]] == [1, 1, 1]
    assert one["step"] == two[0]["step"] == two[1]["step"] == 12, "the other steps train"
    assert math.isfinite(two[0]["result"]["metrics"]["val_loss"])
    for key, value in one["weights"].items():
        assert torch.isfinite(value).all(), key
        # The same global batches, the same step skipped: the weights of one process.
        torch.testing.assert_close(two[0]["weights"][key], value, rtol=1e-9, atol=1e-12)
    if loss == NAN_GRADIENT:  # named alike by one process and by two, whose shards differ
        (_, one_cause), (_, two_cause) = (skipped_causes(tmp_path / n) for n in ("one", "two"))
        assert one_cause == two_cause, (one_cause, two_cause)
        assert re.fullmatch(r"non-finite gradient \(norm nan\) behind a finite loss on every "
                            r"rank, in \S+(, \S+)* and \d+ more", two_cause), two_cause  # fmt: skip


def skipped_causes(out) -> tuple[int, str]:
    """The one skipped step history.jsonl records in ``out``: its step and cause."""
    skips = [r for r in tracker_files.history(out) if "skipped" in r]
    assert len(skips) == 1, skips
    return skips[0]["step"], skips[0]["skipped"]


@pytest.mark.parametrize("grad_clip", [0.0, 0.5], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("strategy", ["ddp", FSDP])
def test_a_nan_gradient_in_one_rank_s_shard_is_named_alike_on_every_rank(
    spawn, tmp_path, strategy, grad_clip
):
    # Under FSDP only rank 0's shard of the offset holds the NaN (its first element); rank 1's
    # is finite, and names it from the flags' sum. Clipping by the NaN norm must not spread it.
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), model="tests.user_code:offset_mlp", strategy=strategy,
              on_nonfinite="stop", grad_clip=grad_clip)  # fmt: skip
    assert set(info.value.failures) == {0, 1}
    said = {re.search(r"NonFiniteStep: (step \d+: .*)", text)[1]
            for text in info.value.failures.values()}  # fmt: skip
    assert said == {"step 3: non-finite gradient (norm nan) behind a finite loss on every rank, "
                    "in offset; stopping every rank (on_nonfinite=stop)"}  # fmt: skip


def test_finite_gradients_whose_norm_overflows_are_skipped_and_said_so(run_cli, tiny):
    done = run_cli("--nproc", 2, "--loss", "tests.user_code:huge_gradient_loss",
                   "--max-consecutive-skips", 3, check=False,
                   **{**tiny, "dtype": "float32"})  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert ("error: step 3: non-finite gradient (norm inf) behind a finite loss on every rank; "
            "every gradient is finite: their norm overflowed; stopping every rank") in done.stderr


def test_under_fp16_a_non_finite_loss_is_skipped_and_keeps_the_loss_scale(spawn, tmp_path):
    # GradScaler would take the NaN gradient a non-finite loss makes for an overflow and halve
    # its scale; a non-finite loss is no overflow: across the skipped step the scale stays.
    ranks = spawn(fit_recording_scales, str(tmp_path), loss=INFINITE_LOSS, **MARKED)
    assert ranks[0] == ranks[1], "every rank skips alike, with one scale"
    steps = ranks[0]["steps"]
    skipped = [i for i, (_, count, _) in enumerate(steps) if count == 1 and
               (i == 0 or steps[i - 1][1] == 0)]  # fmt: skip
    assert len(skipped) == 1 and steps[-1][1] == 1, steps
    at = skipped[0]
    before = steps[at - 1][2] if at else 65536.0  # GradScaler's initial scale
    assert steps[at][2] == before, steps


def test_every_rank_stops_at_a_non_finite_step_naming_how_many_ranks_losses_were(
    spawn, tmp_path
):
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), loss=INFINITE_LOSS, on_nonfinite="stop", **MARKED)
    assert set(info.value.failures) == {0, 1}, "every rank stops, none is left waiting"
    said = {re.search(r"NonFiniteStep: (step \d+: .*)", text)[1]
            for text in info.value.failures.values()}  # fmt: skip
    assert len(said) == 1, said  # the same step and cause on every rank
    assert re.fullmatch(r"step \d+: non-finite loss on 1 of 2 rank\(s\); stopping every rank "
                        r"\(on_nonfinite=stop\)", said.pop())  # fmt: skip


def test_the_nan_gradient_run_says_once_which_step_it_skipped_and_why_and_exits_0(
    run_cli, tiny
):
    done = run_cli("--nproc", 2, "--loss", NAN_GRADIENT, **{**tiny, **MARKED})
    said = [line for line in done.stderr.splitlines() if "update skipped" in line]
    assert len(said) == 1, done.stderr  # from rank 0 only
    step = re.search(r"step (\d+): non-finite gradient \(norm nan\) behind a finite loss on "
                     r"every rank, in net\.0\.weight, net\.0\.bias, net\.2\.weight and 3 more; "
                     r"update skipped on every rank", said[0])  # fmt: skip
    assert step, said
    finished = re.search(r"done: step 12, val_loss (\S+)", done.stderr)
    assert finished and math.isfinite(float(finished[1].rstrip(","))), done.stderr


@pytest.mark.parametrize(
    "loss, why",
    [(NAN_GRADIENT, r"non-finite gradient \(norm nan\) behind a finite loss on every rank, in "
                    r"net\.0\.weight, net\.0\.bias, net\.2\.weight and 3 more"),
     (INFINITE_LOSS, r"non-finite loss on 1 of 2 rank\(s\)")],
    ids=["nan-gradient", "inf-loss"],
)  # fmt: skip
def test_on_nonfinite_stop_stops_every_rank_at_that_step_with_one_line(run_cli, tiny, loss, why):
    done = run_cli("--nproc", 2, "--loss", loss, "--on-nonfinite", "stop", check=False,
                   **{**tiny, **MARKED})  # fmt: skip
    assert done.returncode == 1, done.stderr
    errors = error_lines(done.stderr)
    # One line, from the launcher (each rank recorded the stop when it decided it, so the line
    # stands however the agent ended the ranks after the first exited); that every rank
    # stops at that step is test_every_rank_stops_at_a_non_finite_step_naming_how_many_....
    assert re.fullmatch(rf"error: step \d+: {why}; stopping every rank \(on_nonfinite=stop\)",
                        "\n".join(errors)), errors  # fmt: skip
