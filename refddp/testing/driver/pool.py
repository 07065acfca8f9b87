"""Driver side of the harness: warm pools of rank processes, deadlines, failure reports.

A pool is ``world_size`` rank processes (forked from the rank server, ``rank_server.py``, which
imported torch once and never touches CUDA; fresh interpreters where it cannot run) joined in
one process group through a store this process owns. Pools are started once per (world_size,
backend, debug, devices, nnodes) and reused; any failure closes the pool and the next call
starts a new one, as does a rank found dead between tasks or a task that left state behind that
its ranks could not release. Driver and ranks talk in the named messages of ``protocol.py``;
failures are explained by ``reports.py`` (which rank failed first, who waited on it); nothing
here needs pytest.
"""

from __future__ import annotations

import os
import pickle
import re
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

from refddp.testing.context import RankFailure, RankSkipped, RankTimeout
from refddp.testing.driver import rank_server
from refddp.testing.driver.reports import (
    PoolFiles,
    blame,
    blocked_for_good,
    exception_line,
    find_cause,
    finished_without_joining,
    skipped_headline,
)
from refddp.testing.nodes import simulated as node_layout
from refddp.testing.payload import pickle_call
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
from refddp.testing.rank import coverage as rank_coverage
from refddp.testing.rank import faults as fault_records
from refddp.testing.rank.faults import Fault
from refddp.testing.rank_lists import rank_list
from refddp.testing.slots import read_slot, slot_path_for

DEFAULT_TIMEOUT_S = 60.0
FAILURE_GRACE_S = 0.5  # after the first failure, how long to collect near-simultaneous others
# A rank still inside a collective this long after every other rank finished the task is hung:
# nobody is left to complete it. (Not zero: a peer may return a moment before it does.)
ONE_SIDED_CONFIRM_S = 2.0
HANG_POLL_S = 0.2
STOP_GRACE_S = 5.0  # for ranks to save their coverage data and exit, after Stop or SIGTERM
LAZY_CONNECT_FROM = 128  # ranks: pools this large connect gloo's pairs on first use


def rank_environment(
    backend: str, debug: bool, devices: tuple[str, ...], workdir: str, *, world_size: int
) -> dict[str, str]:
    """The environment a pool's ranks start with: this process's, plus the harness's settings.

    ``devices`` are ``CUDA_VISIBLE_DEVICES`` entries of this process (see ``gpus.py``) that the
    rank sees, in local rank order; coverage settings are added when coverage measures this
    process.
    """
    env = dict(os.environ)
    env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL" if debug else "OFF"
    env.setdefault("OMP_NUM_THREADS", "1")
    if world_size >= LAZY_CONNECT_FROM:
        # Gloo connects a pair of ranks on their first message, not all pairs at the group's
        # creation (torch >= 2.7 reads this; older ones connect the full mesh): a pool of
        # 1,024 ranks otherwise opens half a million connections before its first test. Not
        # below: there a rank waiting on one that died fails at once (its connection
        # breaks), where it would keep trying to connect until the pool is stopped.
        env.setdefault("TORCH_GLOO_LAZY_INIT", "1")
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
        nnodes: int | None = None,
        real_nodes: bool = False,
    ):
        self.nodes = node_layout.layout(world_size, nnodes)
        if real_nodes and self.nodes is None:
            raise ValueError("real_nodes needs nnodes: how many nodes to make")
        self.world_size, self.backend = world_size, backend
        self.cluster: Any = None  # with real_nodes: the cluster.Cluster its nodes are
        self.workdir = tempfile.mkdtemp(prefix="refddp-pool-")
        self.files = PoolFiles(self.workdir, world_size, backend)
        self.sound = True
        self.measured = False
        self.procs: list[Any] = []  # subprocess.Popen or rank_server.RankProcess
        self.conns: list[Connection] = []
        try:  # whatever stops the start (Ctrl-C included) stops what started: ranks, cluster
            self._start(debug, devices, start_timeout_s, real_nodes)
        except BaseException:
            self.close()
            raise

    def _start(self, debug: bool, devices: tuple[str, ...], start_timeout_s: float,
               real_nodes: bool) -> None:  # fmt: skip
        from refddp.launch.dist import loopback_store

        if real_nodes:
            from refddp.testing.cluster import Cluster, unavailable_to_ranks

            if unavailable_to_ranks():
                raise RuntimeError(unavailable_to_ranks())
            self.cluster = Cluster(self.nodes.nnodes)
        world_size, backend = self.world_size, self.backend
        self._store = loopback_store()
        server = rank_server.server()
        for rank in range(world_size):
            mine = node_layout.node_devices(self.nodes, devices, rank)
            env = rank_environment(backend, debug, mine, self.workdir, world_size=world_size)
            if self.nodes is not None:
                env.update(node_layout.torchrun_environment(self.nodes, rank))
            if self.cluster is not None:
                node = self.cluster.nodes[self.nodes.node_of(rank)]
                hosts = self.cluster.hosts_file(node.index)
                env.update(node_layout.real_node_environment(node.namespace, node.hostname, hosts))
            self.measured = rank_coverage.ENV_VAR in env
            ours, theirs = socket.socketpair()
            argv = [
                "--rank", str(rank), "--world-size", str(world_size), "--backend", backend,
                "--store-port", str(self._store.port), "--workdir", self.workdir,
                "--driver-pid", str(os.getpid()),
            ]  # fmt: skip
            out_path = self.files.out_path(rank)
            proc: Any = None
            if server is not None:
                try:
                    proc = server.start_rank(argv, env, out_path, theirs.fileno())
                except OSError as exc:  # the server died or refused: ranks start afresh
                    _say_once(f"refddp: ranks start as fresh interpreters, each importing "
                              f"torch (slower, more memory): {exc}")  # fmt: skip
                    server = None
            if proc is None:
                proc = rank_server.start_interpreter(argv, env, out_path, theirs.fileno())
            theirs.close()
            self.procs.append(proc)
            self.conns.append(Connection(ours.detach()))
        replies, _ = self._collect(range(world_size), time.monotonic() + start_timeout_s)
        errors = {r: _failure_text(m) for r, m in replies.items() if not isinstance(m, Ready)}
        missing = set(range(world_size)) - set(replies)
        if errors or missing:
            failures = {**errors, **{r: "did not start in time" for r in missing}}
            raise RankFailure(self.files.report("pool failed to start", failures, {}), failures)

    def node_dirs(self) -> tuple[str, ...]:
        """Each simulated node's own directory, for the pool's life (outside pytest)."""
        if self.nodes is None:
            return ()
        dirs = tuple(
            os.path.join(self.workdir, "nodes", f"node{n}") for n in range(self.nodes.nnodes)
        )
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        return dirs

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
        faults: tuple[Fault, ...] = (),
        node_dirs: tuple[str, ...] = (),
        before_import: tuple[str, ...] = (),
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; results ordered by rank.

        ``rank_fixtures`` name keyword arguments each rank creates for itself (``dist_ctx``,
        ``monkeypatch``) and tears down after the call; ``faults`` are injected (``faults.py``);
        ``node_dirs`` are the simulated nodes' ``node_tmp_path`` (the pool's own by default);
        ``before_import``: ``RunTask``'s.
        """
        __tracebackhide__ = True
        cut = self._cut_command if self.cluster is not None else None
        faults = fault_records.expand(faults, self._ranks_of_nodes(), [p.pid for p in self.procs],
                                      cut)  # fmt: skip
        for fault in faults:
            if fault.rank >= self.world_size:
                raise ValueError(f"{fault.describe()}: no rank {fault.rank} in a world of "
                                 f"{self.world_size}")  # fmt: skip
        payload = pickle_call(fn, args, kwargs or {})
        module_names = {getattr(fn, "__module__", None), *extra_modules} - {None}
        modules = [(n, getattr(sys.modules.get(n), "__file__", None)) for n in module_names]
        dirs = node_dirs or self.node_dirs()
        task = RunTask(payload, list(sys.path), modules, rank_fixtures, tuple(faults), dirs,
                       before_import)  # fmt: skip
        offsets = [self.files.out_size(r) for r in range(self.world_size)]
        if faults:  # only a task's armed faults write records
            fault_records.clear_records(self.workdir, self.world_size)
        try:
            for conn in self.conns:
                conn.send(task)
        except OSError as exc:
            self.close()
            raise _PoolGone(str(exc)) from exc

        start = time.monotonic()
        replies, one_sided = self._collect(range(self.world_size), start + timeout_s, True)
        fired = fault_records.fired_faults(self.workdir, self.world_size) if faults else {}
        unfired = fault_records.never_fired(faults, fired)
        failures = {r: _failure_text(m) for r, m in replies.items() if isinstance(m, FAILURES)}
        pending = [r for r in range(self.world_size) if r not in replies]
        if failures or pending:
            elapsed = time.monotonic() - start
            self._fail(replies, pending, one_sided, fired, unfired, offsets, elapsed, timeout_s)

        self._check_health([m.health for _, m in sorted(replies.items())])
        self.files.echo_output(offsets)
        skips = [m.reason for m in replies.values() if isinstance(m, Skipped)]
        if skips:
            raise RankSkipped(skips[0])
        if unfired:
            listed = "; ".join(f.describe() for f in unfired)
            reached = "; ".join(
                f"rank {r} entered {read_slot(slot_path_for(self.workdir, r)).entered} "
                "collective(s)"
                for r in sorted({f.rank for f in unfired})
            )
            text = f"fault never fired: {listed} ({reached})"
            raise RankFailure(self.files.report(text, {}, {}, offsets), {})
        return [pickle.loads(replies[r].result) for r in range(self.world_size)]

    def _ranks_of_nodes(self) -> list[list[int]] | None:
        if self.nodes is None:
            return None
        return [list(self.nodes.ranks_of(k)) for k in range(self.nodes.nnodes)]

    def _cut_command(self, node: int) -> list[str]:
        """The command that pulls real node ``node``'s cable (its switch port down)."""
        return ["ip", "-n", self.cluster.switch, "link", "set", f"port{node}", "down"]

    def _lost_nodes(self, replies: dict[int, Reply], fired: dict[int, list[str]]) -> str:
        """``node 1 lost (ranks [2, 3] died); `` for each node a ``kill_node`` fault took down,
        else ``""``."""
        killed = {int(m.group(1)) for lines in fired.values() for line in lines
                  if line.startswith("kill ") and (m := _NODE_LABEL.search(line))}  # fmt: skip
        died = {r for r, m in replies.items() if isinstance(m, Died)}
        of_node = self._ranks_of_nodes() or []
        lost = sorted(k for k in killed if k < len(of_node) and set(of_node[k]) <= died)
        if not lost:
            return ""
        ranks = [r for k in lost for r in of_node[k]]
        nodes = ", ".join(map(str, lost))
        return f"node{'s' if len(lost) > 1 else ''} {nodes} lost (ranks {rank_list(ranks)} died); "

    def _fail(
        self,
        replies: dict[int, Reply],
        pending: list[int],
        one_sided: list[int],
        fired: dict[int, list[str]],
        unfired: list[Fault],
        offsets: list[int],
        elapsed: float,
        timeout_s: float,
    ) -> None:
        """Raise the report of a failed task, naming the rank that failed first; close."""
        __tracebackhide__ = True
        failures = {r: _failure_text(m) for r, m in replies.items() if isinstance(m, FAILURES)}
        stacks = self.files.dump_stacks({r: self.procs[r].pid for r in pending})
        slots = {r: read_slot(slot_path_for(self.workdir, r)) for r in range(self.world_size)}
        acting = {r: lines for r, lines in fired.items()
                  if any(not ln.startswith("delay ") for ln in lines)}  # fmt: skip
        details = [f"fault never fired: {f.describe()}" for f in unfired]
        finished = {r for r, m in replies.items() if not isinstance(m, FAILURES)}
        cause: int | None
        if failures:
            cause = find_cause(replies, acting, slots)
            absent: list[int] = []
            if cause is None:  # every failed rank failed inside a collective: one that a
                # finished rank skipped (its group destroyed as its task ended), or one that
                # the ranks disagreed on
                absent = finished_without_joining(sorted(failures), finished, slots)
            if cause is not None:
                headline, victims = blame(cause, replies, pending, acting, slots, failures[cause])
                details = victims + details
            elif absent:
                how = exception_line(failures[min(failures)])
                headline = skipped_headline(absent, sorted(failures), slots, f"failed in: {how}")
                cause = absent[0] if len(absent) == 1 else None
                if cause is not None:  # each other rank: failed in it, waiting, or elsewhere
                    details = blame(cause, replies, pending, acting, slots, "")[1] + details
            else:
                headline = f"rank(s) {rank_list(failures)} failed"
            headline = self._lost_nodes(replies, fired) + headline
            error: RankFailure = RankFailure(
                self.files.report(headline, failures, stacks, offsets, details),
                failures,
                cause,
            )
        else:
            absent = finished_without_joining(one_sided, finished, slots)
            if one_sided:
                headline = skipped_headline(
                    absent, one_sided, slots,
                    f"are blocked in (a certain hang, reported after {elapsed:.1f} s, "
                    f"deadline {timeout_s:g} s)",
                )  # fmt: skip
                others = [r for r in pending if r not in one_sided]
                if others:
                    headline += f"; rank(s) {rank_list(others)} had not finished either"
            else:
                headline = f"rank(s) {rank_list(pending)} did not finish within {timeout_s:g} s"
            hung = sorted(acting)
            cause = hung[0] if hung else (absent[0] if one_sided and len(absent) == 1 else None)
            details = [f"injected: {ln}" for r in hung for ln in acting[r]] + details
            error = RankTimeout(
                self.files.report(headline, {}, stacks, offsets, details), stacks, cause
            )
        self.close(busy=pending)
        raise error

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
                    replies[rank] = Died(self._exit_description(rank), time.monotonic())
                if isinstance(replies[rank], FAILURES):
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
            if finished and pending:
                stuck = self._stuck_alone(sorted(pending.values()), suspects)
                if stuck:
                    return replies, stuck
        return replies, []

    def _stuck_alone(self, pending: list[int], suspects: dict[int, tuple[str, float]]) -> list[int]:
        """The ranks blocked for good (``reports.blocked_for_good``: waiting only on finished
        ranks and on one another), once one of them has sat in the same collective for
        ONE_SIDED_CONFIRM_S (a collective about to complete changes its slot first)."""
        now, confirmed = time.monotonic(), False
        slots = {r: read_slot(slot_path_for(self.workdir, r)) for r in pending}
        doomed = blocked_for_good(pending, slots, self.world_size)
        for rank in pending:
            if rank not in doomed:
                suspects.pop(rank, None)
            elif rank not in suspects or suspects[rank][0] != slots[rank].last:
                suspects[rank] = (slots[rank].last, now)
            elif now - suspects[rank][1] >= ONE_SIDED_CONFIRM_S:
                confirmed = True
        return doomed if confirmed else []

    def _exit_description(self, rank: int) -> str:
        try:
            code = self.procs[rank].wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "closed its connection but is still running"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def _check_health(self, health: list[Health]) -> None:
        """Recycle the pool if a task left it unsound: group gone, ranks out of step, or state
        a rank could not release (``leftovers.py``)."""
        sequences = {h.sequence for h in health}
        ok = all(
            h.initialized and h.world_size == self.world_size and not h.unclean for h in health
        )
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
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        shutil.rmtree(self.workdir, ignore_errors=True)


_NODE_LABEL = re.compile(r"\(node (\d+)\)$")  # how a node fault's record line ends
_said: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr)


def _failure_text(reply: Reply) -> str:
    if isinstance(reply, Died):
        return reply.why
    return getattr(reply, "text", repr(reply))
