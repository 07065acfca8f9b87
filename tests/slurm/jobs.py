"""What the SLURM tests train and check, on one node or across two: a small job slowed to
~20 ms a step (long enough to signal it mid-run), and the checks that a signalled job stopped
every rank at one step with a checkpoint and that its requeued start resumed from it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from tests.cli_runs import train_command
from tests.slurm.cluster import REPO

FLAGS = dict(train_size=96, val_size=37, input_dim=8, hidden_size=16, batch_size=4, epochs=20,
             dtype="float64", deterministic=True, device="cpu", ckpt_every=10,
             data="tests.user_code:slow_train_datasets")  # fmt: skip
SLOW = {"REFDDP_TEST_SLOW_TRAIN": "0.005"}  # 20 ms a step: long enough to signal during
STOPPED = re.compile(r"\[rank (\d)\] \S+ stopped at step (\d+) \(SIGUSR1\)")
RESUMED = re.compile(r"\[rank 0\] \S+ resumed from (\S+) at epoch \d+, step (\d+)")


def steps(world_size: int) -> int:
    """The job's optimizer steps at ``world_size`` ranks: 20 epochs of 96 / (4 x ranks)."""
    return FLAGS["epochs"] * FLAGS["train_size"] // (FLAGS["batch_size"] * world_size)


def final_weights(out: Path, world_size: int) -> dict[str, torch.Tensor]:
    """The weights of the finished job in ``out`` (which must have run every step)."""
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert (state["step"], state["world_size"]) == (steps(world_size), world_size)
    return state["model_state_dict"]


def assert_identical(weights: dict, reference: dict) -> None:
    assert weights.keys() == reference.keys()
    for key in weights:
        assert torch.equal(weights[key], reference[key]), key


def assert_stopped_then_resumed(text: str, out: Path, world_size: int) -> None:
    """The job's log ``text`` shows every rank stopped at one step, the requeued start resumed
    from the checkpoint written there, and the job then ran to its end."""
    stops = STOPPED.findall(text)
    assert sorted(rank for rank, _ in stops) == [str(r) for r in range(world_size)], text
    (step,) = {int(s) for _, s in stops}  # every rank stopped at the same step ...
    assert 0 < step < steps(world_size)
    (resumed,) = RESUMED.findall(text)  # ... with a checkpoint there, which the next start took
    assert resumed == (str(out / "checkpoints" / "checkpoint_latest.pth"), str(step)), text
    assert f"done: step {steps(world_size)}" in text


def signal_mid_run(cluster, script: str, out: Path, log: Path, *, nodes: int,
                   ranks_per_node: int) -> tuple[dict[str, str], str]:  # fmt: skip
    """Submit ``examples/slurm/<script>`` on ``nodes`` nodes, send it what SLURM sends at
    ``--signal``'s time before the limit once its first checkpoint is written, and wait until
    the job has ended for good; the job's last ``scontrol`` fields and its log."""
    srun_ranks = script == "train_srun.sbatch"  # every rank a task; else one torchrun a node
    tasks_per_node = ranks_per_node if srun_ranks else 1
    env = cluster.env(PYTHON=sys.executable, NPROC_PER_NODE=str(ranks_per_node), **SLOW)
    flags = train_command(out, "--log-all-ranks", **FLAGS)[3:]  # after `python -m refddp.train`
    options = (f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}", f"--output={log}")
    job = cluster.sbatch(REPO / "examples" / "slurm" / script, *flags, env=env, options=options)
    first = out / "checkpoints" / "checkpoint_latest.pth"
    cluster.wait_for(first.exists, f"job {job}'s first checkpoint", log)
    # The scripts' --signal=USR1@T goes to every process of the job's steps; --signal=B:USR1@T
    # (the torchrun script's) to the batch script.
    cluster.client("scancel", *(() if srun_ranks else ("--batch",)), "--signal=USR1", job)
    ended = cluster.wait_until_finished(job)
    return ended, log.read_text()
