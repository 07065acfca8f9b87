"""Running refddp's command-line tools in subprocesses, as a user would (shared by the tests)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def error_lines(stderr: str) -> list[str]:
    """The ``error:`` lines a command wrote (refddp's one-line failures)."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


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
    # PYTHONFAULTHANDLER: every Python process of the run (launcher, ranks, loader workers,
    # which inherit it through fork) writes its threads' stacks on SIGABRT, so a run that hangs
    # in a test fails with the stacks that say where (``stop_hung``).
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **(extra or {})}


class RunHung(subprocess.TimeoutExpired):
    """A run outlived its timeout; its message ends with what it printed, stacks included."""

    SHOWN = 12000  # characters of output the message keeps, the last ones

    def __str__(self) -> str:
        printed = "".join(part for part in (self.output, self.stderr) if part)
        return f"{super().__str__()}; what it printed, every process's stacks last:\n" + printed[-self.SHOWN :]


def _process_tree(root: int) -> list[int]:
    """``root`` and every live descendant (from /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def stop_hung(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Make every process under ``procs`` write its stacks (SIGABRT, no core dump), then kill
    what is left: the tree as it is then (a process started during the grace included) and,
    for a run started in a session of its own, its whole process group."""
    tree = [pid for proc in procs for pid in _process_tree(proc.pid)]
    for pid in tree:
        with contextlib.suppress(OSError):
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            os.kill(pid, signal.SIGABRT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
        time.sleep(0.1)
    for pid in {*tree, *(pid for proc in procs for pid in _process_tree(proc.pid))}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(OSError):
            if os.getpgid(proc.pid) == proc.pid:  # its own group (it may be gone already)
                os.killpg(proc.pid, signal.SIGKILL)


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 240):
    """Run to completion from the repo root (so ``tests.user_code`` imports); output captured.

    A run still going after ``timeout`` raises ``RunHung`` with every process's stacks; an
    interrupted one (Ctrl-C) leaves nothing running."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(env), start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_hung([proc])
        raise RunHung(cmd, timeout, *_output_once_stopped(proc)) from None
    except BaseException:
        stop_hung([proc], grace_s=0)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _output_once_stopped(proc: subprocess.Popen) -> tuple[str, str]:
    """What ``proc`` printed (stdout, stderr), read after ``stop_hung`` ended its tree."""
    try:
        return proc.communicate(timeout=30)  # (its tree is gone: the pipes close)
    except subprocess.TimeoutExpired:  # a process outside its tree holds them
        return "", "(its output could not be read: a process it left holds it)"


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

    A hang raises ``RunHung`` whose message ends with every node's output, each process's
    stacks included (``stop_hung``); no node outlives the call.
    """
    nodes = [start(command) for command in commands]
    try:
        outputs = ["".join(node.communicate(timeout=timeout)) for node in nodes]
    except subprocess.TimeoutExpired as exc:
        stop_hung(nodes)
        printed = []
        for i, node in enumerate(nodes):
            text = "".join(_output_once_stopped(node))
            # Each node's tail, so that one node's stacks cannot crowd out another's.
            tail = text[-RunHung.SHOWN // len(nodes) :]
            printed.append(f"--- node {i} (exit {node.returncode}):\n{tail}")
        raise RunHung(exc.cmd, timeout, "\n".join(printed)) from None
    finally:
        for node in nodes:
            node.kill()
    return [(node.returncode, output) for node, output in zip(nodes, outputs, strict=True)]
