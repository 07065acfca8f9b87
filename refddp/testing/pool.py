"""Driver side of the harness: warm pools of rank processes, deadlines, failure reports.

A pool is ``world_size`` fresh interpreters (``python -m refddp.testing.worker``: no fork, so
CUDA-safe) joined in one process group through a store this process owns. Pools are started
once per (world_size, backend, debug, devices) and reused; any failure kills the pool and the
next call starts a new one.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from refddp.testing.collectives import read_slot, slot_path_for
from refddp.testing.context import RankFailure, RankTimeout

DEFAULT_TIMEOUT_S = 60.0
FAILURE_GRACE_S = 0.5  # after the first failure, how long to collect near-simultaneous others
OUTPUT_TAIL_LINES = 40


class RankPool:
    """``world_size`` live rank processes in one process group, ready to run tasks."""

    def __init__(
        self,
        world_size: int,
        backend: str = "gloo",
        debug: bool = True,
        devices: tuple[int, ...] = (),
        start_timeout_s: float = 120.0,
    ):
        from refddp.dist import loopback_store

        self.world_size, self.backend = world_size, backend
        self.workdir = tempfile.mkdtemp(prefix="refddp-pool-")
        self.sound = True
        self._store = loopback_store()
        env = dict(os.environ)
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL" if debug else "OFF"
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        if backend == "nccl":
            # An NCCL watchdog timeout then dumps each rank's recent collectives here.
            env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
            env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
            env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = os.path.join(self.workdir, "nccl_trace_rank_")
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        for rank in range(world_size):
            ours, theirs = socket.socketpair()
            out = open(self._out_path(rank), "wb")  # noqa: SIM115 - the child owns it
            cmd = [
                sys.executable,
                "-m",
                "refddp.testing.worker",
                "--fd",
                str(theirs.fileno()),
                "--rank",
                str(rank),
                "--world-size",
                str(world_size),
                "--backend",
                backend,
                "--store-port",
                str(self._store.port),
                "--workdir",
                self.workdir,
            ]
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
            out.close()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(Connection(ours.detach()))
        replies = self._collect(range(world_size), time.monotonic() + start_timeout_s)
        errors = {r: m[1] for r, m in replies.items() if m[0] != "ready"}
        missing = set(range(world_size)) - set(replies)
        if errors or missing:
            self.close()
            failures = {**errors, **{r: "did not start in time" for r in missing}}
            raise RankFailure(self._report("pool failed to start", failures, {}), failures)

    # -- running tasks -----------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_modules: tuple[str, ...] = (),
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; results ordered by rank."""
        __tracebackhide__ = True
        try:
            payload = pickle.dumps((fn, args, kwargs or {}))
        except Exception as exc:
            name = getattr(fn, "__qualname__", type(fn).__name__)
            raise TypeError(
                f"cannot send {name} to the ranks: {exc}. Use a module-level function or any "
                "picklable callable, with picklable arguments."
            ) from exc
        module_names = {getattr(fn, "__module__", None), *extra_modules} - {None}
        modules = [(n, getattr(sys.modules.get(n), "__file__", None)) for n in module_names]
        task = {"payload": payload, "sys_path": list(sys.path), "modules": modules}
        offsets = [self._out_size(r) for r in range(self.world_size)]
        for conn in self.conns:
            conn.send(("run", task))

        replies = self._collect(range(self.world_size), time.monotonic() + timeout_s)
        failures = {r: m[1] for r, m in replies.items() if m[0] in ("error", "died")}
        pending = [r for r in range(self.world_size) if r not in replies]
        if failures or pending:
            stacks = self._dump_stacks(pending)
            if failures:
                headline = f"rank(s) {sorted(failures)} failed"
                error: RankFailure = RankFailure(
                    self._report(headline, failures, stacks, offsets), failures
                )
            else:
                headline = f"rank(s) {pending} did not finish within {timeout_s:g} s"
                error = RankTimeout(self._report(headline, {}, stacks, offsets), stacks)
            self.close()
            raise error

        self._check_health([m[-1] for _, m in sorted(replies.items())])
        self._echo_output(offsets)
        skips = [m[1] for m in replies.values() if m[0] == "skip"]
        if skips:
            import pytest

            pytest.skip(skips[0])
        return [pickle.loads(replies[r][1]) for r in range(self.world_size)]

    def _collect(self, ranks: Any, deadline: float) -> dict[int, tuple]:
        """Wait for one reply per rank until the deadline; a dead rank replies ("died", why).

        After the first failure, wait only FAILURE_GRACE_S more: the others are probably
        blocked in a collective with the failed rank and would never answer.
        """
        pending = {self.conns[r]: r for r in ranks}
        replies: dict[int, tuple] = {}
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            for conn in wait(list(pending), timeout=deadline - now):
                rank = pending.pop(conn)
                try:
                    replies[rank] = conn.recv()
                except (EOFError, OSError):
                    replies[rank] = ("died", self._exit_description(rank))
                if replies[rank][0] in ("error", "died", "init_error"):
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        return replies

    def _exit_description(self, rank: int) -> str:
        try:
            code = self.procs[rank].wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "closed its connection but is still running"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def _check_health(self, health: list[dict[str, Any]]) -> None:
        """Recycle the pool if a task left it unsound: group gone, or ranks out of step."""
        sequences = {h["sequence"] for h in health}
        ok = all(h["initialized"] and h["world_size"] == self.world_size for h in health)
        if not ok or len(sequences) > 1:
            self.sound = False

    # -- reports -----------------------------------------------------------------------------

    def _out_path(self, rank: int) -> str:
        return os.path.join(self.workdir, f"rank{rank}.out")

    def _out_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self._out_path(rank))
        except OSError:
            return 0

    def _output(self, rank: int, offset: int) -> str:
        try:
            with open(self._out_path(rank), "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _echo_output(self, offsets: list[int]) -> None:
        for rank, offset in enumerate(offsets):
            for line in self._output(rank, offset).splitlines():
                print(f"[rank {rank}] {line}")

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Every thread's Python stack of each listed (still running) rank, via faulthandler."""
        if not ranks:
            return {}
        paths = {r: os.path.join(self.workdir, f"rank{r}.stack") for r in ranks}
        before = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
        for r in ranks:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline, last = time.monotonic() + 2.0, None
        while time.monotonic() < deadline:  # until every dump has stopped growing
            time.sleep(0.05)
            sizes = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
            if sizes == last and all(sizes[r] > before[r] for r in ranks):
                break
            last = sizes
        stacks = {}
        for r, p in paths.items():
            with open(p, "rb") as f:
                f.seek(before[r])
                text = f.read().decode(errors="replace").strip() or "(no stack could be read)"
            last_collective = read_slot(slot_path_for(self.workdir, r)) or "none"
            stacks[r] = f"last collective entered: {last_collective}\nstack (all threads):\n{text}"
        return stacks

    def _report(
        self,
        headline: str,
        failures: dict[int, str],
        stacks: dict[int, str],
        offsets: list[int] | None = None,
    ) -> str:
        lines = [f"{headline} (world_size={self.world_size}, backend={self.backend})"]
        for rank in range(self.world_size):
            if rank in failures:
                lines.append(f"--- rank {rank} failed:")
                lines += ["    " + ln for ln in failures[rank].rstrip().splitlines()]
            elif rank in stacks:
                lines.append(f"--- rank {rank} was still running:")
                lines += ["    " + ln for ln in stacks[rank].rstrip().splitlines()]
            else:
                lines.append(f"--- rank {rank} finished")
        for rank in range(self.world_size):
            out = self._output(rank, offsets[rank] if offsets else 0).splitlines()
            if out:
                lines.append(f"--- rank {rank} output (last {OUTPUT_TAIL_LINES} lines):")
                lines += [f"[rank {rank}] {ln}" for ln in out[-OUTPUT_TAIL_LINES:]]
        return "\n".join(lines)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every rank (and anything it started) and forget the pool's files."""
        self.sound = False
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
        for proc in self.procs:
            proc.wait()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        shutil.rmtree(self.workdir, ignore_errors=True)


_pools: dict[tuple, RankPool] = {}


def get_pool(world_size: int, backend: str, debug: bool, devices: tuple[int, ...] = ()) -> RankPool:
    """The warm pool for this key, started on first use or after the last one broke."""
    key = (world_size, backend, debug, devices)
    pool = _pools.get(key)
    if pool is None or not pool.sound:
        if pool is not None:
            pool.close()
        pool = _pools[key] = RankPool(world_size, backend, debug, devices)
    return pool


def close_pool(world_size: int, backend: str, debug: bool, devices: tuple[int, ...] = ()) -> None:
    pool = _pools.pop((world_size, backend, debug, devices), None)
    if pool is not None:
        pool.close()


def shutdown_pools() -> None:
    """Stop every pool this process started (also run at exit)."""
    while _pools:
        _, pool = _pools.popitem()
        pool.close()


atexit.register(shutdown_pools)


def spawn_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    backend: str | None = None,
    timeout: float | None = None,
    debug: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on every rank of a ``world_size`` group; one result per rank.

    ``backend=None`` means gloo (the pytest ``spawn`` fixture picks nccl for ``gpu`` tests).
    Raises ``RankFailure`` as soon as a rank fails and ``RankTimeout`` after ``timeout`` seconds.
    """
    __tracebackhide__ = True
    backend = backend or "gloo"
    pool = get_pool(world_size, backend, debug)
    return pool.run(fn, args, kwargs, timeout if timeout is not None else DEFAULT_TIMEOUT_S)
