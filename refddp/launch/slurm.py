"""Ranks that SLURM's ``srun`` starts: one rank per task, the job's layout from SLURM's variables.

``srun -n 4 python -m refddp.train ...`` starts four tasks, and each joins one job as rank
``SLURM_PROCID`` of ``SLURM_STEP_NUM_TASKS``, local rank ``SLURM_LOCALID``. They meet at a
store that rank 0 holds on the first host of the step's node list (``SLURM_STEP_NODELIST``,
else ``SLURM_JOB_NODELIST``), on a port derived from ``SLURM_JOB_ID``; ``MASTER_ADDR`` and
``MASTER_PORT`` override the two.

Who is an srun rank: a process of a job step (``SLURM_STEP_ID`` is set) of two or more tasks.
A batch script itself is no step (its ``SLURM_PROCID`` 0 and ``SLURM_NTASKS`` describe the
allocation, not processes that will join), and a one-task step is one process, which may
start local ranks itself (``--nproc``). torchrun inside an allocation (the sbatch script runs
torchrun once per node) sets its own variables, which win: ``refddp.launch.dist.init_distributed``
asks ``under_torchrun`` first.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from refddp.config.schema import ConfigError

PORT_BASE, PORT_SPAN = 10000, 20000  # below Linux's ephemeral ports (32768-60999)


@dataclass(frozen=True)
class SrunTask:
    """Where this srun task runs in the job, and where its ranks meet."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    port: int

    def device_index(self) -> int:
        """The GPU this task uses: its local rank, or the only GPU it sees (``srun
        --gpus-per-task=1`` narrows ``CUDA_VISIBLE_DEVICES`` to one device per task)."""
        return 0 if torch.cuda.device_count() == 1 else self.local_rank


def srun_task(environ: Mapping[str, str] = os.environ) -> SrunTask | None:
    """This process as a rank of an srun step of several tasks, or None if it is not one."""
    if "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return None
    world_size = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    if world_size < 2:
        return None
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    return SrunTask(
        rank=int(environ["SLURM_PROCID"]),
        world_size=world_size,
        local_rank=int(environ.get("SLURM_LOCALID", 0)),
        host=environ.get("MASTER_ADDR") or first_host(nodes),
        port=int(environ.get("MASTER_PORT") or port_for_job(environ.get("SLURM_JOB_ID", "0"))),
    )


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    host, i = [], 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            end = nodelist.find("]", i)
            if end < 0:
                break
            host.append(nodelist[i + 1 : end].split(",")[0].split("-")[0])
            i = end + 1
        else:
            host.append(nodelist[i])
            i += 1
    if not host or (i < len(nodelist) and nodelist[i] == "["):
        raise ConfigError(f"SLURM_JOB_NODELIST: cannot read a host from {nodelist!r}")
    return "".join(host)


def port_for_job(job_id: str) -> int:
    """The rendezvous port of a job: fixed by its id, so every task derives the same one, and
    two jobs sharing a node rarely collide (``MASTER_PORT`` chooses it otherwise)."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def rendezvous_store(task: SrunTask, timeout: datetime.timedelta) -> dist.Store:
    """The store the job's ranks bootstrap from: rank 0 listens, the others connect (waiting
    up to ``timeout`` for it to come up)."""
    return dist.TCPStore(
        task.host, task.port, task.world_size, is_master=task.rank == 0, timeout=timeout
    )
