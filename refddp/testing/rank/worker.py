"""Rank side of the harness: one process of a pool, run as ``python -m refddp.testing.rank.worker``.

It joins the pool's process group once, then runs tasks sent by the driver (``tasks.py``) over a
private socket until told to stop or until its parent dies; the messages are in ``protocol.py``.
The driver set this interpreter's environment (``TORCH_DISTRIBUTED_DEBUG`` among it, and
coverage's settings when the driver is measured) before start, since both act at start-up.

Fixtures a rank-side test asks for arrive as pickled values (``tmp_path``, a project's own
data fixtures) except those the rank makes itself for each task and undoes after it
(``RANK_FIXTURES``): its ``dist_ctx``, and a fresh ``monkeypatch``. Around each task the rank
arms the task's faults (``faults.py``) and afterwards releases what the task left behind
(``leftovers.py``). Ranks are usually forked from the rank server (``rank_server.py``), which
calls ``main`` in the child; ``python -m refddp.testing.rank.worker`` starts one afresh.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import faulthandler
import functools
import importlib
import importlib.util
import io
import itertools
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from refddp.launch.dist import DistContext, exit_with_parent, pin_gloo_to_loopback
from refddp.testing import context, faults, slots
from refddp.testing.checks import collectives
from refddp.testing.checks import fingerprint as fingerprint_check
from refddp.testing.context import RankContext
from refddp.testing.nodes import simulated as nodes
from refddp.testing.protocol import (
    LOADING_DRIVER_MODULES,
    RANK_FIXTURES,
    STACK_SIGNAL,
    Done,
    Failed,
    Health,
    InitError,
    Ready,
    RunTask,
    Skipped,
    Stop,
)
from refddp.testing.rank import coverage as rank_coverage
from refddp.testing.rank import leftovers

DRIVER_MAIN = "__refddp_driver_main__"


class _TaskUnpickler(pickle.Unpickler):
    """Resolves the driver's ``__main__`` to its script, loaded here under DRIVER_MAIN."""

    def find_class(self, module: str, name: str) -> Any:
        module = DRIVER_MAIN if module == "__main__" else module
        loaded = sys.modules.get(module)
        if loaded is None:
            return super().find_class(module, name)
        # Loaded already (``_import_test_modules``), perhaps from its file under a dotted name
        # whose package is not importable here (pytest's importlib mode, run from outside the
        # rootdir): taken as it is, since pickle's own lookup imports the package first.
        found: Any = loaded
        for part in name.split("."):
            found = getattr(found, part)
        return found


def _import_test_modules(sys_path: list[str], modules: list[tuple[str, str | None]]) -> None:
    """Make the driver's modules importable here, whatever pytest's import mode."""
    # The driver's path, then this process's own, less the directory it started in (``-m``
    # put it first): a module there that the driver cannot see must not shadow the driver's
    # (a stray ``tests.py`` in the directory pytest was started from, say).
    try:
        started_in = ("", os.getcwd())
    except OSError:  # the directory is gone (a test's temporary one): nothing to leave out
        started_in = ("",)
    sys.path[:] = sys_path + [p for p in sys.path if p not in sys_path and p not in started_in]
    with _loading_driver_modules():
        for name, file in modules:
            # The driver's script runs here under another name: its `if __name__ ==
            # "__main__":` block must not run in a rank.
            _import_module(DRIVER_MAIN if name == "__main__" else name, file)


@contextlib.contextmanager
def _loading_driver_modules() -> Iterator[None]:
    """Flag the load of the driver's script and test modules, so that a pool their top-level
    code starts is refused (``RankPool``); the flag is gone once the load is over, however it
    ends."""
    os.environ[LOADING_DRIVER_MODULES] = "1"
    try:
        yield
    finally:
        os.environ.pop(LOADING_DRIVER_MODULES, None)


def _import_module(name: str, file: str | None) -> None:
    """Import ``name`` here, from ``file`` where it is not importable by that name."""
    current = sys.modules.get(name)
    if current is not None and getattr(current, "__file__", None) == file:
        return
    try:
        module = importlib.import_module(name)
        if file is None or getattr(module, "__file__", None) == file:
            return
    except ImportError:
        if file is None:
            raise
    # Not importable by name here (pytest's importlib mode, rootdir-relative names): load
    # it from its file under the name the driver pickled against.
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None, f"cannot load {file}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _health(unclean: tuple[str, ...] = ()) -> Health:
    initialized = dist.is_initialized()
    return Health(
        initialized,
        dist.get_world_size() if initialized else None,
        collectives.process_group_sequence(),
        unclean,
    )


def _make_fixture(name: str, ctx: DistContext) -> Any:
    if name == "dist_ctx":
        return ctx
    if name == "monkeypatch":
        import pytest

        return pytest.MonkeyPatch()
    raise ValueError(f"no rank-side fixture {name!r}; these exist: {', '.join(RANK_FIXTURES)}")


def _run_task(
    task: RunTask, ctx: RankContext, start: leftovers.Baseline, workdir: str
) -> Done | Failed | Skipped:
    collectives.reset_count()
    faults.arm(task.faults, ctx.rank, faults.record_path_for(workdir, ctx.rank))
    if task.node_dirs:
        ctx = dataclasses.replace(ctx, node_tmp_path=Path(task.node_dirs[ctx.node_rank]))
    context._current = ctx
    made: dict[str, Any] = {}
    reply: Callable[[Health], Done | Failed | Skipped]
    try:
        leftovers.fresh_namespace()
        for name in task.before_import:
            _call_once(name)
        _import_test_modules(task.sys_path, task.modules)
        fn, args, kwargs = _TaskUnpickler(io.BytesIO(task.payload)).load()
        for name in task.rank_fixtures:
            made[name] = kwargs[name] = _make_fixture(name, ctx)
        reply = functools.partial(Done, pickle.dumps(fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001 - everything a test raises goes to the driver
        outcomes = sys.modules.get("_pytest.outcomes")
        if (outcomes is not None and isinstance(exc, outcomes.Skipped)) or _is_unittest_skip(exc):
            reply = functools.partial(Skipped, str(getattr(exc, "msg", exc)))
        else:
            reply = functools.partial(
                Failed,
                traceback.format_exc(),
                at=time.monotonic(),
                in_collective=collectives.raised_inside(exc),
            )
    finally:
        faults.disarm()
        collectives.forget_failure()
        context._current = None
        if "monkeypatch" in made:
            made["monkeypatch"].undo()  # the next task on this rank starts unpatched
        sys.stdout.flush()
        sys.stderr.flush()
    return reply(_health(leftovers.clean_up(start)))


@functools.cache
def _call_once(name: str) -> None:
    """Call ``module:function`` (a task's ``before_import``), once in this process."""
    module, _, function = name.partition(":")
    getattr(importlib.import_module(module), function)()


def _is_unittest_skip(exc: BaseException) -> bool:
    import unittest

    return isinstance(exc, unittest.SkipTest)


_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30
IDLE_LOOP_SLACK_NS = 200_000_000


@contextlib.contextmanager
def _coarse_timer_slack() -> Iterator[None]:
    """Threads started inside may wake from timed waits up to 200 ms late (Linux timer slack).

    Gloo's transport thread wakes every 10 ms when idle, only to check whether it should stop;
    measured at 64 ranks, 0.2 % of a core per rank: a thousand idle ranks would keep both
    cores of a 2-core machine busy between tests. A thread inherits the slack of the thread
    that starts it, so every thread the groups' creation starts keeps the coarse slack: the
    transport threads (socket events still wake them at once), the threads that run the
    collectives (their timed waits, torch's collective timeouts, may end up to 200 ms late;
    the harness's own deadlines are the driver's), NCCL's watchdog. This thread gets its own
    back: a test's ``time.sleep`` stays precise. Elsewhere than Linux nothing changes.
    """
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError, TypeError):
            prctl = None
    before = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0) if prctl is not None else -1
    if prctl is None or before < 0:
        yield
        return
    prctl(_PR_SET_TIMERSLACK, IDLE_LOOP_SLACK_NS, 0, 0, 0)
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, before, 0, 0, 0)


def _init_group(args: argparse.Namespace) -> RankContext:
    local_rank = int(os.environ.get("LOCAL_RANK", args.rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size))
    device = "cpu"
    if args.backend == "nccl":
        # The driver restricted CUDA_VISIBLE_DEVICES to this rank's node's leased GPUs (all the
        # pool's without simulated nodes), in local rank order.
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    with nodes.host_network():  # (a real node's rank reaches the store on this machine's)
        store = dist.TCPStore(  # this pool's own store: its keys are the pool's alone
            "127.0.0.1",
            args.store_port,
            is_master=False,
            timeout=datetime.timedelta(seconds=args.init_timeout),
        )
    if nodes.on_real_node():
        # torch 2.5 logs init_process_group's arguments, and a TCPStore's repr formats its
        # socket's addresses, which fails from inside the node's network (family 0); a
        # PrefixStore's repr is plain.
        store = dist.PrefixStore("real-nodes", store)
    _join_pool_group(args, store)
    rejoins = itertools.count(1)  # (every rank rejoins at the end of the same tests)
    context._rejoin_pool_group = lambda: _join_pool_group(
        args, dist.PrefixStore(f"rejoin-{next(rejoins)}", store)
    )
    node = int(os.environ.get("GROUP_RANK", 0))
    return RankContext(
        args.rank, args.world_size, local_rank, device, args.backend, node, local_world
    )


def _join_pool_group(args: argparse.Namespace, store: Any) -> None:
    """Join the pool's default group on ``store`` (with the fingerprint check's own group
    when torch's debug level is DETAIL)."""
    detail = dist.get_debug_level() == dist.DebugLevel.DETAIL
    if detail:
        # Create the groups unwrapped (see collectives.py: torch's DETAIL wrapper crashes DDP
        # on gloo); our own fingerprint check takes its place. DETAIL is restored below.
        dist.set_debug_level(dist.DebugLevel.INFO)
    if not nodes.on_real_node():  # (there gloo binds the node's interface)
        pin_gloo_to_loopback()  # a pool's ranks are all on this machine
    with _coarse_timer_slack():
        dist.init_process_group(
            args.backend,
            store=store,
            rank=args.rank,
            world_size=args.world_size,
            # Hangs are the driver's to detect (with stacks); keep torch's own timeout out of
            # its way.
            timeout=datetime.timedelta(seconds=args.collective_timeout),
        )
        if detail:  # subgroups' and point-to-point checks go through the pool's store
            helper = dist.new_group(backend="gloo")
            collectives.enable_fingerprint_check(helper, store, args.workdir)
            fingerprint_check.replace_torchs_group_check()
    if detail:
        dist.set_debug_level(dist.DebugLevel.DETAIL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--driver-pid", type=int, required=True)
    parser.add_argument("--init-timeout", type=float, default=120.0)
    parser.add_argument("--collective-timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)

    try:
        nodes.enter_real_node()  # (first: while this process has one thread)
        not_on_node = None
    except Exception:  # noqa: BLE001 - the driver reports it, once it can be told
        not_on_node = traceback.format_exc()
    cov = rank_coverage.start()
    if cov is not None:
        # SIGTERM (the driver's second way to stop a busy rank) saves this rank's data too.
        signal.signal(signal.SIGTERM, lambda *_: _exit(cov, 128 + signal.SIGTERM))
    exit_with_parent()
    if os.getppid() != args.driver_pid:
        # The driver died before the line above began watching it: nobody will ever send
        # work, and waiting for the store would keep this rank alive for minutes.
        _exit(cov, 3)
    stack_file = open(os.path.join(args.workdir, f"rank{args.rank}.stack"), "w")  # noqa: SIM115
    arm_stack_dumps(stack_file)
    collectives.install(slots.slot_path_for(args.workdir, args.rank))
    torch.set_num_threads(1)
    nodes.take_node_hostname()

    conn = Connection(args.fd)
    if not_on_node is not None:
        conn.send(InitError(f"could not enter its node: {not_on_node}"))
        _exit(cov, 1)
    try:
        ctx = _init_group(args)
    except BaseException:  # noqa: BLE001
        conn.send(InitError(traceback.format_exc()))
        _exit(cov, 1)
    start = leftovers.baseline()
    conn.send(Ready())
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if isinstance(message, Stop):
            break
        reply = _run_task(message, ctx, start, args.workdir)
        arm_stack_dumps(stack_file)  # (the task may have taken the signal for itself)
        conn.send(reply)
        leftovers.free_destroyed()  # (after the reply: why in leftovers.py)
    _exit(cov, 0)


def arm_stack_dumps(stack_file: Any) -> None:
    """Dump every thread's stack to ``stack_file`` on ``STACK_SIGNAL`` (the driver's request
    when a task hangs). faulthandler's handler runs in C, without the GIL, so a rank blocked
    anywhere answers. Armed afresh after each task: a task that set a handler of its own for
    the signal, then put back what Python had recorded (the default action), would otherwise
    leave the next hang's stack request to kill the rank."""
    faulthandler.unregister(STACK_SIGNAL)  # (register alone keeps an armed handler as it is)
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)


def _exit(cov: Any, code: int) -> None:
    """Save coverage data, then leave at once: tearing the process group down could block on
    peers that are already gone, and nothing else needs saving."""
    rank_coverage.save(cov)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()  # every path ends in _exit: no interpreter finalization with gloo threads alive
