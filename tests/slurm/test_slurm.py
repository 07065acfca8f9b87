"""refddp under a real SLURM (``tests/slurm/cluster.py`` starts one on this machine): srun
starts one rank per task, the sbatch scripts in ``examples/slurm/`` train, and the signal
SLURM sends before a time limit stops every rank at one step with a checkpoint, from which
the requeued job resumes to the weights of an uninterrupted run."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from tests.cli_runs import run, train_command
from tests.slurm.cluster import REPO, Cluster, why_not

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(why_not() is not None, reason=str(why_not())),
]

STEPS = 240  # 20 epochs of 12 steps
FLAGS = dict(train_size=96, val_size=37, input_dim=8, hidden_size=16, batch_size=4, epochs=20,
             dtype="float64", deterministic=True, device="cpu", ckpt_every=10,
             data="tests.user_code:slow_train_datasets")  # fmt: skip
SLOW = {"REFDDP_TEST_SLOW_TRAIN": "0.005"}  # 20 ms a step: long enough to signal during
STOPPED = re.compile(r"\[rank (\d)\] \S+ stopped at step (\d+) \(SIGUSR1\)")
RESUMED = re.compile(r"\[rank 0\] \S+ resumed from (\S+) at epoch \d+, step (\d+)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = Cluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The weights of the same job trained by ``--nproc 2`` outside SLURM."""
    out = tmp_path_factory.mktemp("reference") / "run"
    done = run(train_command(out, "--nproc", 2, **FLAGS))
    assert done.returncode == 0, done.stderr
    return final_weights(out)


def final_weights(out) -> dict[str, torch.Tensor]:
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert state["step"] == STEPS
    return state["model_state_dict"]


def assert_identical(weights, reference):
    assert weights.keys() == reference.keys()
    for key in weights:
        assert torch.equal(weights[key], reference[key]), key


def test_srun_runs_one_rank_per_task_as_one_job_equal_to_nproc_2(cluster, reference, tmp_path):
    out = tmp_path / "run"
    done = cluster.client("srun", "-n", "2", *train_command(out, **FLAGS), check=False)
    assert done.returncode == 0, done.stderr + cluster.logs()  # both tasks exited 0
    # One job of two ranks; before, each task trained a one-rank job of its own.
    assert done.stderr.count("training mlp") == 1 and "on 2 rank(s)" in done.stderr
    assert_identical(final_weights(out), reference)


@pytest.mark.parametrize("script, signal_to", [
    ("train_srun.sbatch", ()),  # --signal=USR1@T: every process of the job's steps
    ("train_torchrun.sbatch", ("--batch",)),  # --signal=B:USR1@T: the batch script
])  # fmt: skip
def test_the_signal_before_the_time_limit_stops_every_rank_and_the_requeued_job_resumes(
    cluster, reference, tmp_path, script, signal_to
):
    out, log = tmp_path / "run", tmp_path / "job.log"
    env = cluster.env(PYTHON=sys.executable, NPROC_PER_NODE="2", **SLOW)
    flags = train_command(out, "--log-all-ranks", **FLAGS)[3:]  # after `python -m refddp.train`
    # Two ranks on this one node: as one task each, or one torchrun starting both.
    layout = ("--ntasks-per-node=2",) if script == "train_srun.sbatch" else ()
    job = cluster.sbatch(REPO / "examples" / "slurm" / script, *flags, env=env,
                         options=("--nodes=1", *layout, f"--output={log}"))  # fmt: skip
    first = out / "checkpoints" / "checkpoint_latest.pth"
    cluster.wait_for(first.exists, f"job {job}'s first checkpoint", log)
    # What SLURM does at --signal's time before the limit.
    cluster.client("scancel", *signal_to, "--signal=USR1", job)
    ended = cluster.wait_until_finished(job)
    text = log.read_text()
    assert (ended["JobState"], ended["Restarts"], ended["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        text + cluster.logs()
    )
    stops = STOPPED.findall(text)
    assert sorted(rank for rank, _ in stops) == ["0", "1"], text
    (step,) = {int(s) for _, s in stops}  # every rank stopped at the same step ...
    assert 0 < step < STEPS
    (resumed,) = RESUMED.findall(text)  # ... with a checkpoint there, which the next start took
    assert resumed == (str(out / "checkpoints" / "checkpoint_latest.pth"), str(step)), text
    assert f"done: step {STEPS}" in text
    assert_identical(final_weights(out), reference)  # ... and the resumed run lost nothing
