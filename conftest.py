"""Repo-only fixtures. The harness itself (spawn, dist_ctx, markers) comes from the refddp
pytest plugin, loaded through its entry point."""

import subprocess
from pathlib import Path

import pytest
import torch

from tests import cli_runs
from tests.cli_runs import train_command

pytest_plugins = ["pytester"]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heavy tests share one xdist group: under ``--dist loadgroup`` (make test, make
    test-all) one worker runs them one after another, so no two load the machine at once and
    none's deadline depends on another's."""
    for item in items:
        if item.get_closest_marker("heavy"):
            item.add_marker(pytest.mark.xdist_group("heavy"))


class CliRun:
    """A finished ``python -m refddp.train`` run: exit code, output, and its run directory."""

    def __init__(self, proc: subprocess.CompletedProcess, out: Path):
        self.returncode, self.stdout, self.stderr, self.out = (
            proc.returncode,
            proc.stdout,
            proc.stderr,
            out,
        )

    def checkpoint(self, name: str = "checkpoint_latest.pth") -> dict:
        return torch.load(self.out / "checkpoints" / name, weights_only=True)

    def weights(self, name: str = "checkpoint_latest.pth") -> dict:
        return self.checkpoint(name)["model_state_dict"]


@pytest.fixture
def run_cli(tmp_path, spawn):
    """Run the real CLI in a subprocess: ``run_cli("--nproc", 2, out="name", check=True)``.

    It asks for ``spawn`` so that CLI tests are marked ``multiproc`` (driver side) and
    ``pytest -m multiproc`` selects them with the rest of the distributed suite.
    """

    def run(*args, out="run", check=True, timeout=240, env=None, **flags):
        out_dir = tmp_path / out
        cmd = train_command(out_dir, *args, **flags)
        proc = cli_runs.run(cmd, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stderr[-4000:]}")
        return CliRun(proc, out_dir)

    return run


@pytest.fixture
def tiny(tmp_path):
    """Flags for a small, fast, exactly reproducible run (float64, constant-size data)."""
    return {
        "train_size": 96,
        "val_size": 37,
        "input_dim": 8,
        "hidden_size": 16,
        "batch_size": 8,
        "epochs": 2,
        "dtype": "float64",
        "deterministic": True,
        "device": "cpu",  # the CPU suite runs on CPU on GPU machines too
    }
