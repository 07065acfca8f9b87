"""Driver side of the harness: a warm pool of rank processes, from its start to its stop.

A pool is ``world_size`` rank processes (forked from the rank server, ``rank_server.py``, which
imported torch once and never touches CUDA; fresh interpreters where it cannot run) joined in
one process group through a store this process owns. Pools are started once per (world_size,
backend, debug, devices, nnodes) and reused (``warm_pools.py``); any failure closes the pool and
the next call starts a new one, as does a rank found dead between tasks or a task that left
state behind that its ranks could not release. This module owns the pool's life: each rank's
environment, starting the ranks and waiting for them to be ready, and stopping them; a task on
a started pool (sending it, its deadline, its replies, its failure report) is ``tasks.py``'s.
Driver and ranks talk in the named messages of ``protocol.py``; nothing here needs pytest.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

from refddp.testing.context import RankFailure
from refddp.testing.driver import rank_server
from refddp.testing.driver.reports import PoolFiles
from refddp.testing.driver.tasks import DEFAULT_TIMEOUT_S, collect_replies, failure_text, run_task
from refddp.testing.faults import Fault
from refddp.testing.nodes import simulated as node_layout
from refddp.testing.protocol import LOADING_DRIVER_MODULES, Ready, Stop
from refddp.testing.rank import coverage as rank_coverage

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
        if os.environ.get(LOADING_DRIVER_MODULES):
            raise RuntimeError(
                "a RankPool was started while a rank loaded the driver's script or test module "
                "to find a task's function: their top-level code runs again in every rank; "
                'start pools under `if __name__ == "__main__":`, in a test or a fixture'
            )
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
        replies, _ = collect_replies(self, range(world_size), time.monotonic() + start_timeout_s)
        errors = {r: failure_text(m) for r, m in replies.items() if not isinstance(m, Ready)}
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

    # -- running tasks (tasks.py) ------------------------------------------------------------

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
        return run_task(self, fn, args, kwargs, timeout_s, extra_modules, rank_fixtures, faults,
                        node_dirs, before_import)  # fmt: skip

    def ranks_of_nodes(self) -> list[list[int]] | None:
        if self.nodes is None:
            return None
        return [list(self.nodes.ranks_of(k)) for k in range(self.nodes.nnodes)]

    def cut_command(self, node: int) -> list[str]:
        """The command that pulls real node ``node``'s cable (its switch port down)."""
        return ["ip", "-n", self.cluster.switch, "link", "set", f"port{node}", "down"]

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


_said: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr)
