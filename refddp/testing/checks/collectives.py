"""A record of the collectives this process issues through ``torch.distributed``.

Three uses: a hang report names the last collective each rank entered (its slot, ``slots.py``,
a small memory-mapped file the driver reads even while the rank is blocked); tests compare the
sequence each rank issued (``record_collectives``) to prove every rank takes the same path;
and, when enabled, every collective is first checked against the other ranks' of its group
(``enable_fingerprint_check``; ``checks/fingerprint.py``), so a mismatch fails with each rank's
call named.

Why our own check rather than torch's: with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch wraps each
new group in ``ProcessGroupWrapper``, and in torch 2.13 constructing DDP on such a gloo group
segfaults (DDP's logger casts the wrapper to ProcessGroupGloo). This check also compares the
reduce op, the src/dst root and the dtype of a rank's own part, which the wrapper's fingerprint
leaves out, pairs all_to_all's split sizes and a send with its receive, and compares calls after
filling in defaults, so ``all_reduce(t)`` and ``all_reduce(t, op=SUM)`` agree.

What is seen: calls through the ``torch.distributed`` namespace, and calls on a process-group
object (``pg.allreduce(...)``: ``process_groups.py``), each counted once (a function that calls
the group's method itself is one collective: a thread-local guard lets nested calls through).
DDP's built-in gradient all-reduce runs in C++ and shows up in the process group's sequence
number instead (``process_group_sequence``); a Python comm hook's all-reduce (refddp's trainer
registers one with ``find_unused_parameters``, ``refddp.training.parallel``) is seen, from inside
autograd. An async collective (``async_op=True``, ``isend``, any group method: they return a
``Work``) counts as entered while its ``Work.wait()`` runs: ``dist.Work.wait`` is wrapped for
that, so a rank waiting on a peer that never joins is reported as fast as for a blocking call (a
wait through ``get_future()`` or a polling loop is not seen).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from refddp.testing import faults
from refddp.testing.checks import fingerprint as fingerprint_check
from refddp.testing.checks import process_groups, signatures
from refddp.testing.checks.fingerprint import CollectiveMismatch
from refddp.testing.slots import ASYNC_WAIT, STATE_INSIDE, STATE_OUTSIDE, Slot

__all__ = ["CollectiveMismatch", "enable_fingerprint_check", "install", "record_collectives"]

_COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",  # FSDP2's parameter all-gather (torch 2.13)
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",  # FSDP2's gradient reduce-scatter (torch 2.13)
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
)
# Point-to-point calls pair different calls (a send, its receive): they are checked pair by
# pair, not by the collective fingerprint. monitored_barrier exists to name a missing rank; a
# fingerprint exchange would hang on it.
_POINT_TO_POINT = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}
_UNCHECKED = _POINT_TO_POINT | {"monitored_barrier"}
_NONBLOCKING = {"isend", "irecv", "batch_isend_irecv"}

_installed = False
_slot: Slot | None = None
_recorders: list[list[str]] = []
_count = 0  # collectives entered in the current task (the "#N" of every report)
# The last exception out of a collective, and which collective it came out of ("#N signature").
_failed: tuple[BaseException, str] | None = None
_checker: Any = None  # the helper process group fingerprints are exchanged on; None: unchecked
_signatures: dict[str, inspect.Signature] = {}
_nesting = threading.local()  # .depth: traced calls this thread is inside
# An async collective's Work -> (members, "#N signature", point to point?) until its wait() (a
# weak key: a Work dropped without waiting leaves nothing behind); an irecv's Work -> the
# comparisons with their sends (a coalesced batch's one Work: each receive's), run before
# waiting for the data.
_in_flight: weakref.WeakKeyDictionary[Any, tuple[str, str, bool]] = weakref.WeakKeyDictionary()
_receives: weakref.WeakKeyDictionary[Any, list[Callable[[], None]]] = weakref.WeakKeyDictionary()
_original_wait: Any = None
_comparing_for = threading.local()  # .work: the Work whose wait compares its receives


def _members(name: str, call: dict[str, Any]) -> str:
    """Who this call waits on, for the slot: "*" for every rank (the default group, a group of
    every rank), global ranks as "0,2" (a registered subgroup, or a point-to-point peer), "?"
    when unknown (a smaller group built from a backend class, a receive from any source)."""
    if name in ("send", "recv", "isend", "irecv"):
        peer = signatures.peer(call, "dst" if "send" in name else "src")
        return "?" if peer is None else str(peer)
    if name == "batch_isend_irecv":
        peers = {getattr(op, "peer", None) for op in call.get("p2p_op_list") or ()}
        return "?" if None in peers or not peers else ",".join(map(str, sorted(peers)))
    ranks = signatures.group_ranks(call.get("group"))
    if ranks is None:
        return "*"
    if isinstance(ranks, str):
        import torch.distributed as dist

        return "*" if call["group"].size() == dist.get_world_size() else "?"
    return ",".join(map(str, ranks))


# Collectives whose root may be left out (None on torch >= 2.6, 0 before): global rank 0.
_ROOT_DEFAULTS = {"gather": "dst", "gather_object": "dst", "scatter": "src",
                  "scatter_object_list": "src", "broadcast_object_list": "src"}  # fmt: skip


def _outside(call: dict[str, Any]) -> bool:
    """Whether this rank is outside the call's group (``new_group`` gave it
    ``GroupMember.NON_GROUP_MEMBER``): torch then only warns and returns."""
    import torch.distributed as dist

    group = call.get("group")
    return group is not None and not hasattr(group, "rank") and (
        group == dist.GroupMember.NON_GROUP_MEMBER
    )


def _bind(name: str, fn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in: `all_reduce(t)` and
    `all_reduce(t, op=SUM)` bind to the same values."""
    signature = _signatures.get(name)
    if signature is None:
        signature = _signatures[name] = inspect.signature(fn)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # let torch raise its own error for a bad call
        return dict(kwargs)
    bound.apply_defaults()
    call = dict(bound.arguments)
    plain = _ROOT_DEFAULTS.get(name)
    if plain and call.get(plain) is None and call.get(f"group_{plain}") is None:
        call[plain] = 0  # what torch takes for a root left out: global rank 0
    return call


def in_flight_with(rank: int) -> bool:
    """Whether an isend, irecv or batch of them of this rank that may pair with a send or
    receive of ``rank`` (to or from it, or from any source) has not been waited on yet,
    besides the one whose wait is comparing its receives (``_traced_wait``). An async
    collective in flight answers no send or receive, so it does not count."""
    peer = str(rank)
    return any(members == "?" or peer in members.split(",")
               for work, (members, _, point_to_point) in list(_in_flight.items())
               if point_to_point and work is not getattr(_comparing_for, "work", None))  # fmt: skip


fingerprint_check.unwaited_with = in_flight_with


def reset_count() -> None:
    """Number collectives from #1 again (at the start of each harness task)."""
    global _count, _failed
    _count, _failed = 0, None
    _in_flight.clear()
    _receives.clear()
    fingerprint_check.new_task()
    if _slot is not None:
        _slot.write(STATE_OUTSIDE, "", 0)  # a report must not show the last task's collective


def raised_inside(exc: BaseException) -> str:
    """The collective ``exc`` (or an exception it was raised from) came out of, this task, as
    "#3 all_reduce(...)"; "" if none did: a rank failing there was probably waiting on a peer."""
    seen: BaseException | None = exc
    while seen is not None and _failed is not None:
        if seen is _failed[0]:
            return _failed[1]
        seen = seen.__cause__ or seen.__context__
    return ""


def forget_failure() -> None:
    """Let go of the exception a collective raised: its frames hold the test's objects."""
    global _failed
    _failed = None


def enable_fingerprint_check(helper_group: Any, store: Any = None, workdir: str | None = None
                             ) -> None:  # fmt: skip
    """Check each collective against every rank's of its group before issuing it: for groups of
    every rank on the board in ``workdir`` (which holds the ranks' slots too; required), a
    mismatch then named over ``helper_group`` (a group of every rank); through ``store`` (the
    pool's) for subgroups and point-to-point calls."""
    global _checker
    if helper_group is not None and workdir is None:
        raise ValueError("enable_fingerprint_check: a helper group needs the pool's workdir")
    install()
    _checker = helper_group
    fingerprint_check.configure(store, workdir)


def _nested() -> bool:
    return getattr(_nesting, "depth", 0) > 0


def _enter(name: str, call: dict[str, Any], run: Callable[[], Any]) -> Any:
    """Count, record and check the collective ``name`` (its arguments by name in ``call``),
    then issue it (``run``), with the slot saying the rank is inside it meanwhile."""
    global _count, _failed
    _count += 1
    fault = faults.due_at_collective(_count) if faults._armed else None
    signature = signatures.describe(name, call)
    if _recorders:
        alike = signatures.describe(name, call, alike=True)
        for log in _recorders:
            log.append(alike)
    members = _members(name, call)
    named = signatures.group_name(call.get("group"))
    # Its place among this rank's calls on its group: a peer blocked in a call this rank has
    # entered is finishing it, not waiting for this rank (``fingerprint._conflict``).
    position = 0 if name in _POINT_TO_POINT else fingerprint_check.enter(members, named)
    async_op = name in _NONBLOCKING or bool(call.get("async_op"))
    if _slot is not None:
        # Inside until the call returns (the fingerprint check blocks even for an async
        # op); an async op then counts as inside again while its Work is waited on
        # (``_traced_wait``). A blocking send or recv waits on its one peer.
        _slot.write(STATE_INSIDE, f"#{_count} {signature} at {_call_site(3)}", _count, members,
                    named, position)  # fmt: skip
    _nesting.depth = getattr(_nesting, "depth", 0) + 1
    try:
        receives: list[tuple[int, Any]] = []
        if _checker is not None and name not in _UNCHECKED:
            fingerprint_check.check(_checker, name, call, signature, _count, named)
        elif _checker is not None and name in _POINT_TO_POINT:
            receives = _pair_up(name, call, signature)
        if fault is not None:  # (a checked collective: every rank of its group is here)
            where = f"collective #{_count} {signature}"
            return faults.fire(fault, where, run)
        result = run()
        works = result if isinstance(result, list) else [result]
        if async_op and _slot is not None:
            label = f"#{_count} {signature}{ASYNC_WAIT}"
            for work in works:
                if work is not None:
                    _in_flight[work] = (members, label, name in _POINT_TO_POINT)
        for index, compare in receives:  # an irecv's: at its wait (its sender posts later)
            work = works[min(index, len(works) - 1)] if works else None
            if work is not None:  # (a coalesced batch, NCCL's, returns one Work for all)
                _receives.setdefault(work, []).append(compare)
        return result
    except BaseException as exc:
        _failed = (exc, f"#{_count} {signature}")
        raise
    finally:
        _nesting.depth -= 1
        if _slot is not None:
            _slot.leave()


def _pair_up(name: str, call: dict[str, Any], signature: str) -> list[tuple[int, Any]]:
    """Post each send's payload for its receiver; compare each receive whose sender has posted
    (a blocking receive waits for the post: the sender posts before it sends). The others, an
    irecv's, come back as (index of its Work, comparison) to run at the Work's wait."""
    ops = [(name, call, signature)]
    if name == "batch_isend_irecv":  # each op's peer is a global rank (P2POp.peer)
        ops = []
        for op in call.get("p2p_op_list") or ():
            kind = getattr(op.op, "__name__", "")
            one = {"tensor": op.tensor, "tag": op.tag, "group": op.group,
                   ("dst" if kind == "isend" else "src"): op.peer}  # fmt: skip
            ops.append((kind, one, f"{signatures.describe(kind, one)} in batch_isend_irecv"))
    pending = []
    for index, (kind, one, what) in enumerate(ops):
        if kind in ("send", "isend"):
            fingerprint_check.before_send(one, what, _count)
            continue
        compare = fingerprint_check.receive_check(one, what, _count)
        if compare is not None and (kind == "recv" or compare.posted()):
            compare()
        elif compare is not None:
            pending.append((index, compare))
    return pending


def _wrap(name: str, fn: Any) -> Any:
    def traced(*args: Any, **kwargs: Any) -> Any:
        call = _bind(name, fn, args, kwargs)
        if _outside(call):  # no collective at all for this rank: not counted, not checked
            return fn(*args, **kwargs)
        if name == "batch_isend_irecv" and isinstance(call.get("p2p_op_list"), list):
            return _enter(name, call, lambda: fn(_with_torchs_own_ops(call["p2p_op_list"])))
        return _enter(name, call, lambda: fn(*args, **kwargs))

    if name in ("isend", "irecv"):
        return _TracedPeerFunction(name, fn, traced)
    traced.__wrapped__ = fn  # type: ignore[attr-defined]
    traced.__name__ = name
    traced.__doc__ = fn.__doc__
    return traced


class _TracedPeerFunction:
    """``isend`` / ``irecv``, traced, and equal to torch's own: ``P2POp`` refuses any ``op``
    that is not (``op not in [isend, irecv]``)."""

    def __init__(self, name: str, fn: Any, traced: Callable[..., Any]):
        self.__name__, self.__wrapped__, self.__doc__ = name, fn, fn.__doc__
        self._traced = traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._traced(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.__wrapped__

    def __hash__(self) -> int:
        return hash(self.__wrapped__)


def _with_torchs_own_ops(ops: list) -> list:
    """The ops, each built again with torch's own ``isend`` / ``irecv`` where it holds our
    traced one: ``batch_isend_irecv`` tells them apart by identity (``op.op is isend``)."""
    import torch.distributed as dist

    return [dist.P2POp(op.op.__wrapped__, op.tensor, op.peer, op.group, op.tag)
            if isinstance(op.op, _TracedPeerFunction) else op for op in ops]  # fmt: skip


def _call_site(depth: int) -> str:
    """Where the code that called the traced function is: "file.py:12 in step"."""
    caller = sys._getframe(depth)
    return f"{caller.f_code.co_filename}:{caller.f_lineno} in {caller.f_code.co_name}"


def _traced_wait(work: Any, *args: Any, **kwargs: Any) -> Any:  # (Work.wait's signature)
    """``Work.wait`` that marks the rank as inside the async collective it waits on, so a peer
    that never joins it is reported as fast as for a blocking call; an irecv's comparison with
    its send runs first."""
    global _failed
    compares = _receives.pop(work, ()) if _receives else ()
    entry = _in_flight.get(work) if _slot is not None else None
    if entry is None and not compares:
        return _original_wait(work, *args, **kwargs)
    members, label, _ = entry or ("?", "", False)
    if _slot is not None:
        _slot.write(STATE_INSIDE, f"{label} at {_call_site(2)}", _count, members)
    try:
        _comparing_for.work = work
        try:
            for compare in compares:
                compare()
        finally:
            _comparing_for.work = None
        done = _original_wait(work, *args, **kwargs)
    except BaseException as exc:
        _in_flight.pop(work, None)
        _failed = (exc, label)
        raise
    finally:
        if _slot is not None:
            _slot.leave()
    if work.is_completed():  # (a wait with a timeout may return before: waited on again)
        _in_flight.pop(work, None)
    return done


def install(slot_path: str | None = None) -> None:
    """Trace ``torch.distributed``'s collectives and the process groups' methods in this
    process (idempotent). With ``slot_path`` the last collective entered is also kept there."""
    global _installed, _slot, _original_wait
    import torch.distributed as dist

    if slot_path is not None and _slot is None:
        _slot = Slot(slot_path)
    if _installed:
        return
    for name in _COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _wrap(name, getattr(dist, name)))
    process_groups.trace(_enter, _nested)
    _original_wait = dist.Work.wait  # public class; a subclass's own wait() is left alone
    dist.Work.wait = _traced_wait
    _installed = True


@contextlib.contextmanager
def record_collectives() -> Iterator[list[str]]:
    """Collect the signature of every collective issued inside: name, shapes and dtypes, and
    with defaults filled in the reduce op, the src/dst root and the group when not the world;
    not what only a root passes (a scatter's list), so a correct program's ranks log alike."""
    install()
    log: list[str] = []
    _recorders.append(log)
    try:
        yield log
    finally:
        _recorders.remove(log)


def process_group_sequence() -> int | None:
    """The default group's collective sequence number, counting C++-issued collectives too."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    group = dist.group.WORLD
    try:
        return int(group._get_sequence_number_for_group())
    except (AttributeError, RuntimeError):
        return None
