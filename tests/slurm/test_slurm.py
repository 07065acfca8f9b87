"""refddp under a real SLURM (``tests/slurm/cluster.py`` starts one on this machine): srun
starts one rank per task, the sbatch scripts in ``examples/slurm/`` train, and the signal
SLURM sends before a time limit stops every rank at one step with a checkpoint, from which
the requeued job resumes to the weights of an uninterrupted run."""

from __future__ import annotations

import pytest

from tests.cli_runs import run, train_command
from tests.slurm.cluster import Cluster, why_not
from tests.slurm.jobs import (
    FLAGS,
    assert_identical,
    assert_stopped_then_resumed,
    final_weights,
    signal_mid_run,
)

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.heavy,
    pytest.mark.skipif(why_not() is not None, reason=str(why_not())),
]


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
    return final_weights(out, 2)


def test_srun_runs_one_rank_per_task_as_one_job_equal_to_nproc_2(cluster, reference, tmp_path):
    out = tmp_path / "run"
    done = cluster.client("srun", "-n", "2", *train_command(out, **FLAGS), check=False)
    assert done.returncode == 0, done.stderr + cluster.logs()  # both tasks exited 0
    # One job of two ranks; before, each task trained a one-rank job of its own.
    assert done.stderr.count("training mlp") == 1 and "on 2 rank(s)" in done.stderr
    assert_identical(final_weights(out, 2), reference)


@pytest.mark.parametrize("script", ["train_srun.sbatch", "train_torchrun.sbatch"])
def test_the_signal_before_the_time_limit_stops_every_rank_and_the_requeued_job_resumes(
    cluster, reference, tmp_path, script
):
    out = tmp_path / "run"
    ended, text = signal_mid_run(cluster, script, out, tmp_path / "job.log", nodes=1,
                                 ranks_per_node=2)  # fmt: skip
    assert (ended["JobState"], ended["Restarts"], ended["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        text + cluster.logs()
    )
    assert_stopped_then_resumed(text, out, 2)
    assert_identical(final_weights(out, 2), reference)  # ... and the resumed run lost nothing
