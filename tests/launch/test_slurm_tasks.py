"""Processes given what srun gives the tasks of one step join one job, without SLURM (the
real srun: ``tests/slurm/``)."""

import os

import torch

from tests.cli_runs import start, train_command


def test_tasks_with_srun_variables_train_one_job(tmp_path, spawn):
    """Two processes with what srun gives two tasks of one step on this host form one 2-rank
    job, meeting at the port the job id gives (the id: this test's pid)."""
    out = tmp_path / "run"
    flags = dict(train_size=64, val_size=16, input_dim=4, hidden_size=8, batch_size=4, epochs=1,
                 device="cpu")  # fmt: skip
    step = {"SLURM_JOB_ID": str(os.getpid()), "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NODELIST": "127.0.0.1"}  # fmt: skip
    tasks = [start(train_command(out, **flags),
                   env={**step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in (0, 1)]  # fmt: skip
    try:
        outputs = [task.communicate(timeout=240)[1] for task in tasks]
    finally:
        for task in tasks:
            task.kill()
    assert [task.returncode for task in tasks] == [0, 0], outputs
    assert "on 2 rank(s)" in outputs[0] and "training" not in outputs[1]
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert (state["world_size"], state["step"]) == (2, 64 // 8)
