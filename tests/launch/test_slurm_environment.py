"""SLURM's environment read as a job's layout (``refddp/launch/slurm.py``), without SLURM: which
processes are srun ranks, where they meet, and that they form one job. ``tests/slurm/``
proves the same against a real SLURM."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from refddp import train
from refddp.config.schema import ConfigError, TrainConfig
from refddp.launch import slurm
from refddp.workload.data import make_loader

# What srun sets in the task with SLURM_PROCID 1 of a 4-task step (2 per node) of job 4242.
STEP = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_NODELIST": "gpu[07-08],cpu1",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
}  # fmt: skip


def test_a_task_of_a_several_task_step_is_one_rank_of_one_job():
    task = slurm.srun_task(STEP)
    assert task == slurm.SrunTask(rank=1, world_size=4, local_rank=1, host="gpu07",
                                  port=slurm.port_for_job("4242"))  # fmt: skip
    given = slurm.srun_task({**STEP, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"})
    assert (given.host, given.port) == ("10.0.0.5", 29400)
    job_wide = {k: v for k, v in STEP.items() if k not in ("SLURM_STEP_NODELIST",
                                                            "SLURM_STEP_NUM_TASKS")}  # fmt: skip
    assert slurm.srun_task(job_wide) == task, "the job's node list and task count otherwise"


def test_a_batch_script_or_a_one_task_step_is_no_srun_rank():
    batch = {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}  # PROCID 0, NTASKS 4 there
    assert slurm.srun_task({**batch, "SLURM_PROCID": "0"}) is None
    assert slurm.srun_task({**STEP, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) is None
    assert slurm.srun_task({}) is None


@pytest.mark.parametrize("nodelist, host", [
    ("vm", "vm"), ("node1,node2", "node1"), ("gpu[03-05,9],cpu1", "gpu03"),
    ("rack[2-3]-n[10-12]", "rack2-n10"), ("a-b[001-004]", "a-b001"), ("h[7]", "h7"),
])  # fmt: skip
def test_the_rendezvous_host_is_the_first_of_the_node_list(nodelist, host):
    assert slurm.first_host(nodelist) == host


def test_an_unreadable_node_list_is_one_line():
    for nodelist in ("gpu[03-05", ""):
        with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST: cannot read a host"):
            slurm.first_host(nodelist)


def test_the_port_is_the_same_for_every_task_of_a_job_and_below_ephemeral_ports():
    ports = {slurm.port_for_job(str(job)) for job in range(100_000, 100_500)}
    assert len(ports) == 500 and all(10000 <= p < 30000 for p in ports)
    assert slurm.port_for_job("4242") == slurm.port_for_job("4242")


def test_a_task_that_sees_one_gpu_uses_it(monkeypatch):
    task = slurm.srun_task(STEP)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # srun --gpus-per-task=1
    assert task.device_index() == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the node's GPUs
    assert task.device_index() == 1


def test_nproc_under_a_several_task_step_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    for key, value in STEP.items():
        monkeypatch.setenv(key, value)
    assert train.main(["--out", str(tmp_path), "--nproc", "2", "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: nproc: under srun every task is one rank (this step has 4 tasks); "
                     "drop --nproc, or run torchrun once per node (examples/slurm/)"]  # fmt: skip


def test_loader_workers_outlive_the_stop_signals_slurm_sends_every_process(tmp_path):
    """SLURM signals every process of a job step; the rank decides when to stop, so its
    loader workers must not die of the signal meanwhile."""
    c = TrainConfig(out=str(tmp_path), num_workers=1, train_size=16, batch_size=2)
    dataset = torch.utils.data.TensorDataset(torch.arange(16.0), torch.arange(16))
    batches = iter(make_loader(dataset, range(16), 2, c, pin=False, seed=0))
    next(batches)
    for worker in batches._workers:  # torch's worker processes, alive now
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            os.kill(worker.pid, sig)
    assert len(list(batches)) == 7, "the rest of the epoch still comes"
