"""SLURM across nodes (issue 40): slurmctld and one slurmd on each node of a
``refddp.testing.cluster.Cluster`` (network namespaces, each with its own address and host
name), so ``srun -N 2`` places tasks on two machines whose ranks meet over the bridge, and the
sbatch scripts of ``examples/slurm/`` run as written: two nodes, the time-limit signal, the
requeue. Skipped, with the reason, without SLURM or without root."""

from __future__ import annotations

import pytest
import torch

from refddp.testing import cluster as network_module
from refddp.testing.cluster import Cluster as Network
from tests.cli_runs import run, train_command
from tests.slurm import jobs
from tests.slurm.cluster import Cluster, why_not

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.heavy,
    pytest.mark.skipif(why_not() is not None, reason=str(why_not())),
    pytest.mark.skipif(network_module.unavailable() is not None,
                       reason=str(network_module.unavailable())),  # fmt: skip
    # slurmd runs jobs as root, on nodes in the machine's lists: no user namespace
    pytest.mark.skipif(network_module.in_user_namespace(),
                       reason="SLURM's nodes need root's capabilities"),  # fmt: skip
]
FLAGS = dict(train_size=96, val_size=37, input_dim=8, hidden_size=16, batch_size=4, epochs=2,
             dtype="float64", deterministic=True, device="cpu")  # fmt: skip
TWO_BY_TWO = ("-N", "2", "--ntasks-per-node", "2")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    with Network(2) as network:
        started = Cluster(tmp_path_factory.mktemp("slurm-nodes"), network).start()
        try:
            yield started
        finally:
            started.stop()


def weights(out) -> dict[str, torch.Tensor]:
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert state["step"] == 12 and state["world_size"] == 4
    return state["model_state_dict"]


def test_srun_on_two_nodes_trains_one_job_of_four_ranks_equal_to_one_node(two_nodes, tmp_path):
    placed = two_nodes.client("srun", *TWO_BY_TWO, "-l", "hostname").stdout.split("\n")
    tasks = dict(line.split(": ") for line in placed if line.strip())
    assert tasks == {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}
    out = tmp_path / "run"
    done = two_nodes.client("srun", *TWO_BY_TWO, *train_command(out, **FLAGS), check=False)
    assert done.returncode == 0, done.stderr + two_nodes.logs()
    assert done.stderr.count("training mlp") == 1 and "on 4 rank(s)" in done.stderr
    reference = run(train_command(tmp_path / "one-node", "--nproc", 4, **FLAGS))
    assert reference.returncode == 0, reference.stderr
    mine, theirs = weights(out), weights(tmp_path / "one-node")
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The weights of the slowed job (``tests/slurm/jobs.py``) trained by ``--nproc 2``."""
    out = tmp_path_factory.mktemp("reference") / "run"
    done = run(train_command(out, "--nproc", 2, **jobs.FLAGS))
    assert done.returncode == 0, done.stderr
    return jobs.final_weights(out, 2)


@pytest.mark.parametrize("script", ["train_srun.sbatch", "train_torchrun.sbatch"])
def test_the_time_limit_signal_stops_both_nodes_and_the_requeued_job_resumes_on_both(
    two_nodes, reference, tmp_path, script
):
    # One rank a node: bit-exact resume at 3+ ranks is DDP's to give (known-limitations.md).
    out = tmp_path / "run"  # on both nodes: the shared disk the scripts ask for
    ended, text = jobs.signal_mid_run(two_nodes, script, out, tmp_path / "job.log", nodes=2,
                                      ranks_per_node=1)  # fmt: skip
    assert (ended["JobState"], ended["Restarts"], ended["ExitCode"]) == ("COMPLETED", "1", "0:0"), (
        text + two_nodes.logs()
    )
    assert ended["NodeList"] == "node[0-1]", ended  # the requeued start, too, on both nodes
    jobs.assert_stopped_then_resumed(text, out, 2)
    jobs.assert_identical(jobs.final_weights(out, 2), reference)
