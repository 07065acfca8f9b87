"""Running refddp's command-line tools in subprocesses, as a user would (shared by the tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def train_command(out: Path | str, *args: object, **flags: object) -> list[str]:
    """``python -m refddp.train --no-progress --out OUT ARGS... --flag value...``."""
    cmd = [sys.executable, "-m", "refddp.train", "--no-progress", "--out", str(out)]
    cmd += [str(a) for a in args]
    for key, value in flags.items():
        flag = key.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            cmd += [f"--{flag}", str(value)]
    return cmd


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 240):
    """Run to completion from the repo root (so ``tests.user_code`` imports); output captured."""
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=_env(env))  # fmt: skip


def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start in the background, for tests that signal the job while it runs."""
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(env))  # fmt: skip
