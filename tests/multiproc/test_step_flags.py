"""``flags_read=late`` (the default on CUDA with several ranks, run here on the CPU): each
step's agreement, read a step later.

The non-finite skip happens on the device (a fused optimizer's ``found_inf``), and the host
reads the agreed flags only once the next step is queued, so a step needs no host sync. Every
guarantee of ``flags_read=now`` must still hold: the same steps skipped on every rank, the same
train loss, the same stop step on every rank (one step later), exact resume. CPU runs it too:
the fused kernels exist there, and this is where CI can prove it.
"""

import re
import signal

import pytest
import torch

from refddp.testing import RankFailure
from tests.multiproc.test_resume import assert_same_weights, evaluations, history
from tests.rank_tasks import (
    fit,
    fit_full_weights,
    fit_recording_host_reads,
    fit_signalled_after_step,
    optimizer_where_cuda_fuses,
)

ROUNDING = {"rtol": 1e-9, "atol": 1e-12}  # float64: fused and foreach kernels round apart
EXPLODING = dict(data="tests.user_code:exploding_datasets", global_batch_size=8)


@pytest.mark.parametrize("world_size", [1, 2])
def test_late_flags_skip_the_same_steps_as_now_on_the_device(spawn, tmp_path, world_size):
    # About one step in three has an inf loss; evaluations every 3 steps land on some of them,
    # where the step's flags must be read before the train loss is reported.
    job = dict(EXPLODING, eval_every=3)
    now = spawn(fit, str(tmp_path / "now"), world_size=world_size, **job)[0]
    late = spawn(fit, str(tmp_path / "late"), world_size=world_size, flags_read="late", **job)[0]
    skipped = now["result"]["skipped_steps"]
    assert 0 < skipped == late["result"]["skipped_steps"] < now["step"] == late["step"]
    for key, value in now["weights"].items():
        assert torch.isfinite(late["weights"][key]).all(), key
        torch.testing.assert_close(late["weights"][key], value, **ROUNDING, msg=key)
    reported = evaluations(tmp_path / "late")
    assert len(reported) == len(evaluations(tmp_path / "now")) == 8
    for ours, theirs in zip(reported, evaluations(tmp_path / "now"), strict=True):
        assert ours == pytest.approx(theirs, rel=1e-9), "the train loss leaves out skipped steps"
    for record in history(tmp_path / "late"):  # one target per sample: every step's counted
        assert record["targets_per_s"] == pytest.approx(record["samples_per_s"], rel=1e-12)


def test_late_flags_stop_every_rank_on_a_nonfinite_loss_naming_the_same_step(spawn, tmp_path):
    steps = []
    for read in ("now", "late"):
        with pytest.raises(RankFailure) as info:
            spawn(fit, str(tmp_path / read), flags_read=read, on_nonfinite="stop", **EXPLODING)
        assert set(info.value.failures) == {0, 1}, "every rank stops, none is left waiting"
        pattern = r"NonFiniteLoss: non-finite loss at step (\d+) on at least one rank"
        steps.append({re.search(pattern, text)[1] for text in info.value.failures.values()})
    assert len(steps[0]) == 1 and steps[0] == steps[1]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_stop_signal_read_late_stops_every_rank_a_step_later_and_resumes_exactly(
    spawn, tmp_path, strategy
):
    flags = dict(strategy=strategy, flags_read="late")
    straight = spawn(fit_full_weights, str(tmp_path / "straight"), **flags)[0]
    out = str(tmp_path / "run")
    stopped = spawn(fit_signalled_after_step, out, 5, 1, **flags)  # rank 1 alone, after step 5
    # Step 6's flags carry it; they are read during step 7: every rank stops there (now: 6).
    assert [(r["step"], r["stopped_by"]) for r in stopped] == [(7, signal.SIGTERM)] * 2
    resumed = spawn(fit_full_weights, out, **flags)[0]
    assert resumed["resumed_from"] and resumed["step"] == straight["step"] == 24
    assert_same_weights(resumed["weights"], straight["weights"])  # bit for bit
    assert_same_weights(resumed["optimizer"]["state"], straight["optimizer"]["state"])


def test_a_first_step_skipped_before_the_optimizer_has_state_is_read_now(spawn, tmp_path):
    # A fused SGD's skipped first step would leave its momentum buffers uninitialised.
    job = dict(data="tests.user_code:first_step_explodes_datasets", optimizer="sgd", epochs=1)
    now = spawn(fit_full_weights, str(tmp_path / "now"), **job)[0]
    late = spawn(fit_full_weights, str(tmp_path / "late"), flags_read="late", **job)[0]
    assert_same_weights(late["weights"], now["weights"], **ROUNDING)
    assert_same_weights(late["optimizer"]["state"], now["optimizer"]["state"], **ROUNDING)


@pytest.mark.parametrize(
    "world_size, optimizer", [(1, "adamw"), (2, "adamw"), (2, "sgd")], ids=["1", "2", "2-sgd"]
)
def test_a_late_step_reads_nothing_but_the_previous_steps_flags(
    spawn, tmp_path, world_size, optimizer
):
    job = dict(optimizer=optimizer, momentum=0.0)  # SGD without momentum: no state, ever
    late = spawn(fit_recording_host_reads, str(tmp_path / "late"), world_size=world_size,
                 flags_read="late", **job)[0]  # fmt: skip
    steps = late["reads"]
    assert len(steps) == late["step"] == 48 // world_size
    # AdamW's step 1 reads now (no optimizer state yet); a stateless SGD's reads late from
    # the start. Then each step reads at most the flags copied a step ago (none right after an
    # evaluation or save, which read them already).
    assert ("device" in steps[0]) == (optimizer == "adamw"), steps[0]
    assert all(reads in ([], ["flags"]) for reads in steps[1:]), steps
    assert steps.count(["flags"]) >= len(steps) * 3 // 4
    now = spawn(fit_recording_host_reads, str(tmp_path / "now"), world_size=world_size,
                flags_read="now", **job)[0]  # fmt: skip
    assert all("device" in reads for reads in now["reads"]), "the probe sees a step's host sync"


@pytest.mark.parametrize("strategy, ckpt_format", [("ddp", "full"), ("fsdp", "dcp")])
def test_a_run_resumes_across_flags_read_with_this_invocations_kernels(
    spawn, tmp_path, strategy, ckpt_format
):
    # load_state_dict would bring back the saved run's kernels (fused=None from a `now` run)
    # under a `late` invocation, whose fused-only found_inf skip would then fail.
    job = dict(EXPLODING, strategy=strategy, ckpt_format=ckpt_format)
    straight = spawn(fit_full_weights, str(tmp_path / "straight"), **job)[0]
    out = str(tmp_path / "run")
    spawn(fit_full_weights, out, stop_after=5, **job)  # flags_read now: foreach kernels
    resumed = spawn(fit_full_weights, out, flags_read="late", **job)[0]
    assert resumed["resumed_from"] and resumed["step"] == straight["step"]
    assert resumed["fused"], "the resumed optimizer runs this invocation's fused kernels"
    assert_same_weights(resumed["weights"], straight["weights"], **ROUNDING)


@pytest.mark.world_size(1)
@pytest.mark.parametrize("fuses", [True, False])
def test_the_trainer_fuses_its_optimizer_reading_now_where_cuda_has_the_kernel(
    spawn, tmp_path, fuses
):
    # On CUDA the optimizer is fused whether the flags are read now or late (one kernel a step):
    # the trainer asks fuses_on_cuda, stood in for here since the CPU never answers yes.
    (result,) = spawn(optimizer_where_cuda_fuses, str(tmp_path), fuses)
    assert not result["late"], "one process reads now"
    assert result["fused"] == [fuses], result
