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


def torchrun_node_command(rendezvous_port: int, nnodes: int, out: Path | str, *args: object,
                          **flags: object) -> list[str]:  # fmt: skip
    """One "node" of a plain-torchrun job on loopback, joining a rendezvous store the caller
    holds on ``rendezvous_port`` (as a cluster's external store would be held)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
                "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{rendezvous_port}", "--rdzv-conf", "is_host=false",
                "--rdzv-id", "t", "--local-addr", "127.0.0.1"]  # fmt: skip
    return torchrun + train_command(out, *args, **flags)[1:]  # `-m refddp.train ...` follows


def run_nodes(commands: list[list[str]], timeout: float = 240) -> list[tuple[int, str]]:
    """Start the nodes in this order (on one host torchrun ranks nodes by process id, so the
    first becomes rank 0) and wait for all: each node's (exit code, output).

    A hang raises ``subprocess.TimeoutExpired`` carrying every node's output; no node outlives
    the call.
    """
    nodes = [start(command) for command in commands]
    try:
        outputs = ["".join(node.communicate(timeout=timeout)) for node in nodes]
    except subprocess.TimeoutExpired as exc:
        for node in nodes:
            node.kill()
        exc.output = "\n".join("".join(node.communicate()) for node in nodes)
        raise
    finally:
        for node in nodes:
            node.kill()
    return [(node.returncode, output) for node, output in zip(nodes, outputs, strict=True)]
