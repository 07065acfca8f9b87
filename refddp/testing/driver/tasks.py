"""Driver side of the harness: a task on a started pool, from sending it to its outcome.

``run_task`` sends one ``RunTask`` to every rank of a pool (``pool.py``, which owns the ranks'
start and stop), waits for each rank's reply until the task's deadline (``collect_replies``:
after a failure, only until replies stop for a moment, or until a rank is certainly hung),
and turns the replies into the ranks' results, ``RankSkipped``, or a ``RankFailure`` /
``RankTimeout`` whose report (``reports.py``) names the rank that failed first; a failed or
interrupted task closes its pool, one that left it unsound marks it so. Apart from
``pool.py`` because this is what a task does with a pool, not how a pool comes to be;
``pool.py`` imports this module (its start waits for ``Ready`` through ``collect_replies``),
so the pool is passed in, never imported.
"""

from __future__ import annotations

import math
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import wait
from typing import Any

from refddp.testing import faults as fault_records
from refddp.testing.context import RankFailure, RankSkipped, RankTimeout
from refddp.testing.driver.reports import (
    blame,
    blocked_for_good,
    exception_line,
    find_cause,
    finished_without_joining,
    skipped_headline,
    waiting_on_one_another_headline,
)
from refddp.testing.faults import Fault
from refddp.testing.payload import pickle_call
from refddp.testing.protocol import FAILURES, Died, Health, Reply, RunTask, Skipped
from refddp.testing.rank_lists import rank_list
from refddp.testing.slots import read_slot, slot_path_for

DEFAULT_TIMEOUT_S = 60.0
# After a failure, how long to wait for the next reply: a rank blocked with the failed one
# never replies, while ranks failing together (all told of one mismatch) reply in a trickle
# that, on a loaded machine, can outlast any fixed window from the first failure.
FAILURE_GRACE_S = 0.5
# A rank still inside a collective this long after every other rank finished the task is hung:
# nobody is left to complete it. (Not zero: a peer may return a moment before it does.)
ONE_SIDED_CONFIRM_S = 2.0
HANG_POLL_S = 0.2


class _PoolGone(Exception):
    """The pool had lost a rank before the task was sent: nothing of the task ran."""


def run_task(
    pool: Any,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any] | None,
    timeout_s: float,
    extra_modules: tuple[str, ...],
    rank_fixtures: tuple[str, ...],
    faults: tuple[Fault, ...],
    node_dirs: tuple[str, ...],
    before_import: tuple[str, ...],
) -> list[Any]:
    """``RankPool.run`` on ``pool`` (a ``pool.RankPool``): the arguments as it takes them."""
    __tracebackhide__ = True
    cut = pool.cut_command if pool.cluster is not None else None
    faults = fault_records.expand(faults, pool.ranks_of_nodes(), [p.pid for p in pool.procs],
                                  cut)  # fmt: skip
    for fault in faults:
        if fault.rank >= pool.world_size:
            raise ValueError(f"{fault.describe()}: no rank {fault.rank} in a world of "
                             f"{pool.world_size}")  # fmt: skip
    payload = pickle_call(fn, args, kwargs or {})
    module_names = {getattr(fn, "__module__", None), *extra_modules} - {None}
    modules = [(n, getattr(sys.modules.get(n), "__file__", None)) for n in module_names]
    dirs = node_dirs or pool.node_dirs()
    task = RunTask(payload, list(sys.path), modules, rank_fixtures, tuple(faults), dirs,
                   before_import)  # fmt: skip
    offsets = [pool.files.out_size(r) for r in range(pool.world_size)]
    if faults:  # only a task's armed faults write records
        fault_records.clear_records(pool.workdir, pool.world_size)
    start = time.monotonic()
    try:
        try:
            for conn in pool.conns:
                conn.send(task)
        except OSError as exc:
            pool.close()
            raise _PoolGone(str(exc)) from exc
        replies, one_sided = collect_replies(pool, range(pool.world_size), start + timeout_s, True)
    except BaseException as interruption:
        if not isinstance(interruption, _PoolGone):
            _interrupted(pool, interruption, offsets)
        raise
    fired = fault_records.fired_faults(pool.workdir, pool.world_size) if faults else {}
    unfired = fault_records.never_fired(faults, fired)
    failures = {r: failure_text(m) for r, m in replies.items() if isinstance(m, FAILURES)}
    pending = [r for r in range(pool.world_size) if r not in replies]
    if failures or pending:
        elapsed = time.monotonic() - start
        _fail(pool, replies, pending, one_sided, fired, unfired, offsets, elapsed, timeout_s)

    _check_health(pool, [m.health for _, m in sorted(replies.items())])
    pool.files.echo_output(offsets)
    skips = [m.reason for m in replies.values() if isinstance(m, Skipped)]
    if skips:
        raise RankSkipped(skips[0])
    if unfired:
        listed = "; ".join(f.describe() for f in unfired)
        reached = "; ".join(
            f"rank {r} entered {read_slot(slot_path_for(pool.workdir, r)).entered} collective(s)"
            for r in sorted({f.rank for f in unfired})
        )
        text = f"fault never fired: {listed} ({reached})"
        raise RankFailure(pool.files.report(text, {}, {}, offsets), {})
    return [pickle.loads(replies[r].result) for r in range(pool.world_size)]


def _lost_nodes(pool: Any, replies: dict[int, Reply], fired: dict[int, list[str]]) -> str:
    """``node 1 lost (ranks [2, 3] died); `` for each node a ``kill_node`` fault took down,
    else ``""``."""
    killed = {int(m.group(1)) for lines in fired.values() for line in lines
              if line.startswith("kill ") and (m := _NODE_LABEL.search(line))}  # fmt: skip
    died = {r for r, m in replies.items() if isinstance(m, Died)}
    of_node = pool.ranks_of_nodes() or []
    lost = sorted(k for k in killed if k < len(of_node) and set(of_node[k]) <= died)
    if not lost:
        return ""
    ranks = [r for k in lost for r in of_node[k]]
    nodes = ", ".join(map(str, lost))
    return f"node{'s' if len(lost) > 1 else ''} {nodes} lost (ranks {rank_list(ranks)} died); "


def _fail(
    pool: Any,
    replies: dict[int, Reply],
    pending: list[int],
    one_sided: list[int],
    fired: dict[int, list[str]],
    unfired: list[Fault],
    offsets: list[int],
    elapsed: float,
    timeout_s: float,
) -> None:
    """Raise the report of a failed task, naming the rank that failed first; close the pool."""
    __tracebackhide__ = True
    failures = {r: failure_text(m) for r, m in replies.items() if isinstance(m, FAILURES)}
    stacks = pool.files.dump_stacks({r: pool.procs[r].pid for r in pending})
    slots = {r: read_slot(slot_path_for(pool.workdir, r)) for r in range(pool.world_size)}
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
            said = {exception_line(text) for text in failures.values()}
            if len(said) == 1:  # one error told to every failed rank (a collective mismatch)
                headline += f": {said.pop()}"
        headline = _lost_nodes(pool, replies, fired) + headline
        error: RankFailure = RankFailure(
            pool.files.report(headline, failures, stacks, offsets, details),
            failures,
            cause,
        )
    else:
        absent = finished_without_joining(one_sided, finished, slots)
        certain = f"(a certain hang, reported after {elapsed:.1f} s, deadline {timeout_s:g} s)"
        if one_sided:
            headline = (skipped_headline(absent, one_sided, slots, f"are blocked in {certain}")
                        if absent else waiting_on_one_another_headline(one_sided, slots, certain))
            others = [r for r in pending if r not in one_sided]
            if others:
                headline += f"; rank(s) {rank_list(others)} had not finished either"
        else:
            headline = f"rank(s) {rank_list(pending)} did not finish within {timeout_s:g} s"
        hung = sorted(acting)
        cause = hung[0] if hung else (absent[0] if one_sided and len(absent) == 1 else None)
        details = [f"injected: {ln}" for r in hung for ln in acting[r]] + details
        error = RankTimeout(
            pool.files.report(headline, {}, stacks, offsets, details), stacks, cause
        )
    pool.close(busy=pending)
    raise error


def _interrupted(pool: Any, interruption: BaseException, offsets: list[int]) -> None:
    """The driver was interrupted while the ranks ran a task (Ctrl-C, pytest-timeout's
    failure, a signal handler's exception): the ranks are still running it, so the pool is
    stopped and the next task starts a new one (a warm pool would otherwise hand that task
    this one's replies). Unless it was Ctrl-C, each rank's stack and output go to stderr
    first: the interruption's own report shows only the driver's wait."""
    pool.sound = False  # replaced before the next task, even if the close below is cut short
    try:
        if not isinstance(interruption, (KeyboardInterrupt, SystemExit)):
            running = {r: proc.pid for r, proc in enumerate(pool.procs) if proc.poll() is None}
            headline = (f"refddp: the task was interrupted ({type(interruption).__name__}: "
                        f"{str(interruption).strip()[:200]}) while the ranks ran it")  # fmt: skip
            stacks = pool.files.dump_stacks(running)
            print(pool.files.report(headline, {}, stacks, offsets), file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - the interruption is what the caller must see
        print(f"refddp: the ranks' stacks could not be read: {exc!r}", file=sys.stderr)
    finally:
        pool.close(busy=range(pool.world_size))


def collect_replies(
    pool: Any, ranks: Iterable[int], deadline: float, watch_hangs: bool = False
) -> tuple[dict[int, Reply], list[int]]:
    """Wait for one reply per rank until the deadline; a dead rank replies ``Died``.

    After a failure, wait only until FAILURE_GRACE_S pass with no reply: the others are
    probably blocked in a collective with the failed rank and would never answer, but while
    replies keep coming (many ranks told of one mismatch at once, replying one after another
    on a loaded machine) the window stays open. With
    ``watch_hangs``, once some ranks finished cleanly, also stop early when a rank is stuck
    in a collective the finished ones will never join; those ranks are returned second.
    """
    pending = {pool.conns[r]: r for r in ranks}
    replies: dict[int, Reply] = {}
    suspects: dict[int, tuple[str, float]] = {}
    quiet_until = math.inf  # past a failure: when FAILURE_GRACE_S will have passed unheard
    while pending:
        now = time.monotonic()
        if now >= min(deadline, quiet_until):
            break
        finished = (
            watch_hangs and replies and not any(isinstance(m, FAILURES) for m in replies.values())
        )
        timeout = min(deadline, quiet_until) - now
        for conn in wait(list(pending), timeout=min(timeout, HANG_POLL_S) if finished else timeout):
            rank = pending.pop(conn)
            try:
                replies[rank] = conn.recv()
            except (EOFError, OSError):
                replies[rank] = Died(_exit_description(pool, rank), time.monotonic())
            if quiet_until < math.inf or isinstance(replies[rank], FAILURES):
                quiet_until = time.monotonic() + FAILURE_GRACE_S
        if finished and pending:
            stuck = _stuck_alone(pool, sorted(pending.values()), suspects)
            if stuck:
                return replies, stuck
    return replies, []


def _stuck_alone(
    pool: Any, pending: list[int], suspects: dict[int, tuple[str, float]]
) -> list[int]:
    """The ranks blocked for good (``reports.blocked_for_good``: waiting only on finished
    ranks and on one another), once one of them has sat in the same collective for
    ONE_SIDED_CONFIRM_S (a collective about to complete changes its slot first)."""
    now, confirmed = time.monotonic(), False
    slots = {r: read_slot(slot_path_for(pool.workdir, r)) for r in pending}
    doomed = blocked_for_good(pending, slots, pool.world_size)
    for rank in pending:
        if rank not in doomed:
            suspects.pop(rank, None)
        elif rank not in suspects or suspects[rank][0] != slots[rank].last:
            suspects[rank] = (slots[rank].last, now)
        elif now - suspects[rank][1] >= ONE_SIDED_CONFIRM_S:
            confirmed = True
    return doomed if confirmed else []


def _exit_description(pool: Any, rank: int) -> str:
    try:
        code = pool.procs[rank].wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "closed its connection but is still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _check_health(pool: Any, health: list[Health]) -> None:
    """Recycle the pool if a task left it unsound: group gone, ranks out of step, or state
    a rank could not release (``leftovers.py``)."""
    sequences = {h.sequence for h in health}
    ok = all(h.initialized and h.world_size == pool.world_size and not h.unclean for h in health)
    if not ok or len(sequences) > 1:
        pool.sound = False


_NODE_LABEL = re.compile(r"\(node (\d+)\)$")  # how a node fault's record line ends


def failure_text(reply: Reply) -> str:
    if isinstance(reply, Died):
        return reply.why
    return getattr(reply, "text", repr(reply))
