"""Driver side of the harness: warm pools of rank processes, deadlines, failure reports.

A pool is ``world_size`` fresh interpreters (``python -m refddp.testing.worker``: no fork, so
CUDA-safe) joined in one process group through a store this process owns. Pools are started
once per (world_size, backend, debug, devices) and reused; any failure closes the pool and the
next call starts a new one, as does a rank found dead between tasks. Driver and ranks talk in
the named messages of ``protocol.py``; nothing here needs pytest.
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
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from typing import Any

from refddp.testing import rank_coverage
from refddp.testing.collectives import read_slot, slot_path_for
from refddp.testing.context import RankFailure, RankSkipped, RankTimeout
from refddp.testing.protocol import (
    FAILURES,
    Died,
    Health,
    Ready,
    Reply,
    RunTask,
    Skipped,
    Stop,
)
from refddp.testing.reports import PoolFiles

DEFAULT_TIMEOUT_S = 60.0
FAILURE_GRACE_S = 0.5  # after the first failure, how long to collect near-simultaneous others
# A rank still inside a collective this long after every other rank finished the task is hung:
# nobody is left to complete it. (Not zero: a peer may return a moment before it does.)
ONE_SIDED_CONFIRM_S = 2.0
HANG_POLL_S = 0.2
STOP_GRACE_S = 5.0  # for ranks to save their coverage data and exit, after Stop or SIGTERM


def rank_environment(
    backend: str, debug: bool, devices: tuple[str, ...], workdir: str
) -> dict[str, str]:
    """The environment a pool's ranks start with: this process's, plus the harness's settings.

    ``devices`` are ``CUDA_VISIBLE_DEVICES`` entries of this process (see ``gpus.py``), in rank
    order; coverage settings are added when coverage measures this process.
    """
    env = dict(os.environ)
    env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL" if debug else "OFF"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if backend == "nccl":
        # An NCCL watchdog timeout then dumps each rank's recent collectives here.
        env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = os.path.join(workdir, "nccl_trace_rank_")
    env.update(rank_coverage.rank_environment())
    return env


class _PoolGone(Exception):
    """The pool had lost a rank before the task was sent: nothing of the task ran."""


class RankPool:
    """``world_size`` live rank processes in one process group, ready to run tasks."""

    def __init__(
        self,
        world_size: int,
        backend: str = "gloo",
        debug: bool = True,
        devices: tuple[str, ...] = (),
        start_timeout_s: float = 120.0,
    ):
        from refddp.dist import loopback_store

        self.world_size, self.backend = world_size, backend
        self.workdir = tempfile.mkdtemp(prefix="refddp-pool-")
        self.files = PoolFiles(self.workdir, world_size, backend)
        self.sound = True
        self._store = loopback_store()
        env = rank_environment(backend, debug, devices, self.workdir)
        self.measured = rank_coverage.ENV_VAR in env
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        for rank in range(world_size):
            ours, theirs = socket.socketpair()
            out = open(self.files.out_path(rank), "wb")  # noqa: SIM115 - the child owns it
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
                "--driver-pid",
                str(os.getpid()),
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
        replies, _ = self._collect(range(world_size), time.monotonic() + start_timeout_s)
        errors = {r: _failure_text(m) for r, m in replies.items() if not isinstance(m, Ready)}
        missing = set(range(world_size)) - set(replies)
        if errors or missing:
            self.close()
            failures = {**errors, **{r: "did not start in time" for r in missing}}
            raise RankFailure(self.files.report("pool failed to start", failures, {}), failures)

    # -- running tasks -----------------------------------------------------------------------

    def alive(self) -> bool:
        """Every rank is still running (one may have died between tasks: OOM killer, a stray
        ``os._exit`` in a thread)."""
        return all(proc.poll() is None for proc in self.procs)

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_modules: tuple[str, ...] = (),
        rank_fixtures: tuple[str, ...] = (),
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; results ordered by rank.

        ``rank_fixtures`` name keyword arguments each rank creates for itself (``dist_ctx``,
        ``monkeypatch``) and tears down after the call.
        """
        __tracebackhide__ = True
        payload = _pickle_call(fn, args, kwargs or {})
        module_names = {getattr(fn, "__module__", None), *extra_modules} - {None}
        modules = [(n, getattr(sys.modules.get(n), "__file__", None)) for n in module_names]
        task = RunTask(payload, list(sys.path), modules, rank_fixtures)
        offsets = [self.files.out_size(r) for r in range(self.world_size)]
        try:
            for conn in self.conns:
                conn.send(task)
        except OSError as exc:
            self.close()
            raise _PoolGone(str(exc)) from exc

        start = time.monotonic()
        replies, one_sided = self._collect(range(self.world_size), start + timeout_s, True)
        failures = {r: _failure_text(m) for r, m in replies.items() if isinstance(m, FAILURES)}
        pending = [r for r in range(self.world_size) if r not in replies]
        if failures or pending:
            stacks = self.files.dump_stacks({r: self.procs[r].pid for r in pending})
            if failures:
                headline = f"rank(s) {sorted(failures)} failed"
                error: RankFailure = RankFailure(
                    self.files.report(headline, failures, stacks, offsets), failures
                )
            else:
                if one_sided:
                    headline = (
                        f"rank(s) {one_sided} blocked in a collective that every other rank "
                        f"finished without (a certain hang, reported after "
                        f"{time.monotonic() - start:.1f} s, deadline {timeout_s:g} s)"
                    )
                else:
                    headline = f"rank(s) {pending} did not finish within {timeout_s:g} s"
                error = RankTimeout(self.files.report(headline, {}, stacks, offsets), stacks)
            self.close(busy=pending)
            raise error

        self._check_health([m.health for _, m in sorted(replies.items())])
        self.files.echo_output(offsets)
        skips = [m.reason for m in replies.values() if isinstance(m, Skipped)]
        if skips:
            raise RankSkipped(skips[0])
        return [pickle.loads(replies[r].result) for r in range(self.world_size)]

    def _collect(
        self, ranks: Iterable[int], deadline: float, watch_hangs: bool = False
    ) -> tuple[dict[int, Reply], list[int]]:
        """Wait for one reply per rank until the deadline; a dead rank replies ``Died``.

        After the first failure, wait only FAILURE_GRACE_S more: the others are probably
        blocked in a collective with the failed rank and would never answer. With
        ``watch_hangs``, once some ranks finished cleanly, also stop early when a rank is stuck
        in a collective the finished ones will never join; those ranks are returned second.
        """
        pending = {self.conns[r]: r for r in ranks}
        replies: dict[int, Reply] = {}
        suspects: dict[int, tuple[str, float]] = {}
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            finished = (
                watch_hangs
                and replies
                and not any(isinstance(m, FAILURES) for m in replies.values())
            )
            timeout = min(deadline - now, HANG_POLL_S) if finished else deadline - now
            for conn in wait(list(pending), timeout=timeout):
                rank = pending.pop(conn)
                try:
                    replies[rank] = conn.recv()
                except (EOFError, OSError):
                    replies[rank] = Died(self._exit_description(rank))
                if isinstance(replies[rank], FAILURES):
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
            if finished and pending:
                stuck = self._stuck_alone(sorted(pending.values()), suspects)
                if stuck:
                    return replies, stuck
        return replies, []

    def _stuck_alone(self, pending: list[int], suspects: dict[int, tuple[str, float]]) -> list[int]:
        """Pending ranks that have sat in the same collective for ONE_SIDED_CONFIRM_S while the
        other ranks had finished: a whole-world collective, or any one when a single rank is
        left (a subgroup or send/recv peer may still be among several pending ranks)."""
        now, stuck = time.monotonic(), []
        for rank in pending:
            slot = read_slot(slot_path_for(self.workdir, rank))
            if not (slot.inside and (slot.on_world or len(pending) == 1)):
                suspects.pop(rank, None)
                continue
            if rank not in suspects or suspects[rank][0] != slot.last:
                suspects[rank] = (slot.last, now)
            elif now - suspects[rank][1] >= ONE_SIDED_CONFIRM_S:
                stuck.append(rank)
        return stuck

    def _exit_description(self, rank: int) -> str:
        try:
            code = self.procs[rank].wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "closed its connection but is still running"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def _check_health(self, health: list[Health]) -> None:
        """Recycle the pool if a task left it unsound: group gone, or ranks out of step."""
        sequences = {h.sequence for h in health}
        ok = all(h.initialized and h.world_size == self.world_size for h in health)
        if not ok or len(sequences) > 1:
            self.sound = False

    # -- life cycle --------------------------------------------------------------------------

    def close(self, busy: Iterable[int] = ()) -> None:
        """Stop every rank, then forget the pool's files.

        Idle ranks get ``Stop`` (they save coverage data and exit); ``busy`` ones, still inside
        a task, get SIGTERM when coverage is measured (its handler saves and exits) or SIGKILL.
        Whatever is left after STOP_GRACE_S is killed, with anything it started.
        """
        self.sound = False
        busy = set(busy)
        for rank, proc in enumerate(self.procs):
            if proc.poll() is not None:
                continue
            if rank in busy:
                proc.terminate() if self.measured else proc.kill()
                continue
            try:
                self.conns[rank].send(Stop())
            except OSError:
                proc.kill()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            try:  # the whole session: a rank's own children too
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                if proc.poll() is None:
                    proc.kill()
        for proc in self.procs:
            proc.wait()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        shutil.rmtree(self.workdir, ignore_errors=True)


def _failure_text(reply: Reply) -> str:
    if isinstance(reply, Died):
        return reply.why
    return getattr(reply, "text", repr(reply))


def _pickle_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bytes:
    """``(fn, args, kwargs)`` pickled, or a TypeError naming what cannot be sent."""
    try:
        return pickle.dumps((fn, args, kwargs))
    except Exception as exc:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        for key, value in kwargs.items():
            try:
                pickle.dumps(value)
            except Exception:  # noqa: BLE001 - any pickling error: name the argument
                raise TypeError(
                    f"cannot send argument {key!r} of {name} to the ranks: {exc}. Arguments and "
                    "fixture values must be picklable."
                ) from exc
        raise TypeError(
            f"cannot send {name} to the ranks: {exc}. Use a module-level function or any "
            "picklable callable, with picklable arguments."
        ) from exc


_pools: dict[tuple, RankPool] = {}


def get_pool(world_size: int, backend: str, debug: bool, devices: tuple[str, ...] = ()) -> RankPool:
    """The warm pool for this key, started on first use, after the last one broke, or when a
    rank of it died between tasks."""
    key = (world_size, backend, debug, devices)
    pool = _pools.get(key)
    if pool is None or not pool.sound or not pool.alive():
        if pool is not None:
            pool.close()
        pool = _pools[key] = RankPool(world_size, backend, debug, devices)
    return pool


def run_on_pool(
    key: tuple[int, str, bool, tuple[str, ...]],
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    timeout_s: float,
    extra_modules: tuple[str, ...] = (),
    rank_fixtures: tuple[str, ...] = (),
) -> list[Any]:
    """Run a task on the warm pool for ``key`` (world_size, backend, debug, devices).

    A pool found dead while the task was being sent is replaced and the task sent once more:
    nothing of it had run.
    """
    __tracebackhide__ = True
    try:
        return get_pool(*key).run(fn, args, kwargs, timeout_s, extra_modules, rank_fixtures)
    except _PoolGone:
        return get_pool(*key).run(fn, args, kwargs, timeout_s, extra_modules, rank_fixtures)


def close_pool(world_size: int, backend: str, debug: bool, devices: tuple[str, ...] = ()) -> None:
    """Stop the pool for this key, if one runs."""
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
    Raises ``RankFailure`` as soon as a rank fails, ``RankTimeout`` after ``timeout`` seconds
    (or sooner for a certain hang) and ``RankSkipped`` if a rank skipped.
    """
    __tracebackhide__ = True
    key = (world_size, backend or "gloo", debug, ())
    return run_on_pool(key, fn, args, kwargs, timeout if timeout is not None else DEFAULT_TIMEOUT_S)
