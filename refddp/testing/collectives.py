"""A record of the collectives this process issues through ``torch.distributed``.

Three uses: a hang report names the last collective each rank entered (written to a small
memory-mapped file the driver can read even while the rank is blocked); tests compare the
sequence each rank issued (``record_collectives``) to prove every rank takes the same path;
and, when enabled, every collective on the default group is first checked against the other
ranks' (``enable_fingerprint_check``), so a mismatch fails with both collectives named.

Why our own check rather than torch's: with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch wraps each
new group in ``ProcessGroupWrapper``, and in torch 2.13 constructing DDP on such a gloo group
segfaults (DDP's logger casts the wrapper to ProcessGroupGloo). This check also compares the
reduce op and the src/dst root, which the wrapper's fingerprint leaves out, and compares calls
after filling in defaults, so ``all_reduce(t)`` and ``all_reduce(t, op=SUM)`` agree.

Only calls made through the ``torch.distributed`` namespace are seen; DDP's built-in gradient
all-reduce runs in C++ and shows up in the process group's sequence number instead
(``process_group_sequence``). A Python comm hook's all-reduce (refddp's trainer registers one
with ``find_unused_parameters``, ``refddp.parallel``) is seen, from inside autograd. An async
collective (``async_op=True``, ``isend``) counts as entered while its ``Work.wait()`` runs:
``dist.Work.wait`` is wrapped for that, so a rank waiting on a peer that never joins is reported
as fast as for a blocking call (a wait through ``get_future()`` or a polling loop is not seen).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import mmap
import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

from refddp.testing import faults, rank_lists

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
_SLOT_BYTES = 1024

# Ops whose tensors legitimately differ between ranks (uneven splits, src/dst-only lists):
# only their names, roots (src/dst) and groups are compared. Point-to-point ops pair
# different calls, so are not checked.
_NAME_ONLY = {
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "gather_object",
    "scatter_object_list",
    "all_gather_object",
    "broadcast_object_list",
}
# Collectives whose single tensor is this rank's own part, sized as the list that every rank
# passes says (all_gather's and reduce_scatter's parts may differ in size between ranks): the
# fingerprint compares the list and leaves the own part out.
_OWN_PART = {"all_gather": "tensor", "reduce_scatter": "output"}
# monitored_barrier exists to name a missing rank; a fingerprint exchange would hang on it.
_UNCHECKED = {"send", "recv", "isend", "irecv", "batch_isend_irecv", "monitored_barrier"}
_NONBLOCKING = {"isend", "irecv", "batch_isend_irecv"}
_FINGERPRINT_BYTES = 256

_ROOT_ARGS = (("src", "group_src"), ("dst", "group_dst"))
_STATE_OUTSIDE, _STATE_INSIDE = b"-", b"I"  # who it waits on is the slot's members field

_installed = False
_slot: mmap.mmap | None = None
_recorders: list[list[str]] = []
_count = 0  # collectives entered in the current task (the "#N" of every report)
_failed: tuple[BaseException, str] | None = None  # the last exception out of a collective, where
_checker: Any = None  # the helper process group fingerprints are exchanged on
_signatures: dict[str, inspect.Signature] = {}
# An async collective's Work -> (members, "#N signature") until its wait() (a weak key: a Work
# dropped without waiting leaves nothing behind).
_in_flight: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
_original_wait: Any = None


class CollectiveMismatch(RuntimeError):
    """Ranks issued different collectives at the same point on the default group."""


def _shape(value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
        shapes = [tuple(t.shape) for t in value]
        if len(set(shapes)) == 1:
            return f"[{len(value)}x{shapes[0]}]"
        return f"[{', '.join(map(str, shapes))}]"
    return None


def _op_name(op: Any) -> str:
    # ReduceOp.SUM is a RedOpType; ReduceOp(ReduceOp.SUM) wraps one in `.op`.
    return str(getattr(getattr(op, "op", op), "name", op))


def _group_ranks(group: Any) -> list[int] | str | None:
    """None for the default group (however it was named), else the group's global ranks."""
    import torch.distributed as dist

    if group is None or group is dist.group.WORLD:  # WORLD: the default group itself
        return None
    try:
        return list(dist.get_process_group_ranks(group))
    except (KeyError, RuntimeError, ValueError):
        # Built from a backend class directly (ProcessGroupGloo(store, rank, size)), as torch
        # allows: torch never registered its ranks.
        return f"unregistered({group.size()})"


def _members(name: str, call: dict[str, Any]) -> str:
    """Who this call waits on, for the slot: "*" for the whole default group, global ranks as
    "0,2" (a registered subgroup, or a point-to-point peer), "?" when unknown (a group built from
    a backend class, a receive from any source)."""
    if name in ("send", "recv", "isend", "irecv"):
        peer = call.get("dst", call.get("src"))
        return "?" if peer is None else str(peer)
    if name == "batch_isend_irecv":
        peers = {getattr(op, "peer", None) for op in call.get("p2p_op_list") or ()}
        return "?" if None in peers or not peers else ",".join(map(str, sorted(peers)))
    ranks = _group_ranks(call.get("group"))
    if ranks is None:
        return "*"
    return ",".join(map(str, ranks)) if isinstance(ranks, list) else "?"


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
    return dict(bound.arguments)


def _describe(name: str, call: dict[str, Any], shapes: bool = True) -> str:
    """`all_reduce((4,):float32, SUM)`, `broadcast((4,):float32, src=1, group=[0, 2])`."""
    parts = []
    if shapes:
        parts += [s for s in map(_shape, call.values()) if s is not None]
    if "op" in call:
        parts.append(_op_name(call["op"]))
    for plain, in_group in _ROOT_ARGS:
        if call.get(plain) is not None:
            parts.append(f"{plain}={call[plain]}")
        elif call.get(in_group) is not None:
            parts.append(f"{in_group}={call[in_group]}")
    ranks = _group_ranks(call.get("group"))
    if ranks is not None:
        parts.append(f"group={ranks}")
    return f"{name}({', '.join(parts)})"


def _check_fingerprint(signature: str) -> None:
    """Check that every rank is issuing this collective; raise on every rank if any differs.

    One small all-reduce carries a 56-bit hash of each rank's signature as (min, -max): equal
    only if every rank's is. Only on a mismatch are the signatures themselves all-gathered to
    name them (an all-gather of every rank's text costs several times the all-reduce on many
    ranks). These collectives pair the k-th checked collective of every rank, so only the
    signature is compared; the "#N" shown is each rank's own count for the current task.
    """
    import torch
    import torch.distributed as dist

    digest = int.from_bytes(hashlib.blake2b(signature.encode(), digest_size=7).digest(), "big")
    extremes = torch.tensor([digest, -digest], dtype=torch.int64)
    dist.distributed_c10d.all_reduce(extremes, op=dist.ReduceOp.MIN, group=_checker)
    if extremes[0] != -extremes[1]:
        _name_the_mismatch(signature)


def _name_the_mismatch(signature: str) -> None:
    """All-gather every rank's signature and count, and raise naming each distinct one with
    the ranks running it."""
    import torch
    import torch.distributed as dist

    data = signature.encode()[:_FINGERPRINT_BYTES].ljust(_FINGERPRINT_BYTES, b"\0")
    mine = torch.frombuffer(bytearray(data + _count.to_bytes(8, "little")), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(_checker))]
    dist.distributed_c10d.all_gather(everyone, mine, group=_checker)
    raw = [bytes(t.tolist()) for t in everyone]
    seen = [r[:_FINGERPRINT_BYTES].rstrip(b"\0").decode(errors="replace") for r in raw]
    counts = [int.from_bytes(r[_FINGERPRINT_BYTES:], "little") for r in raw]
    groups = rank_lists.group((r, f"#{counts[r]} {s}") for r, s in enumerate(seen))
    listed = "; ".join(
        f"{rank_lists.who(ranks)} {'is' if len(ranks) == 1 else 'are'} running {what}"
        for ranks, what in groups
    )
    raise CollectiveMismatch(f"Detected mismatch between collectives on ranks: {listed}")


def reset_count() -> None:
    """Number collectives from #1 again (at the start of each harness task)."""
    global _count, _failed
    _count, _failed = 0, None
    _in_flight.clear()
    _write_slot(_STATE_OUTSIDE, "")  # a report must not show the last task's collective


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


def enable_fingerprint_check(helper_group: Any) -> None:
    """Check each default-group collective against every rank's before issuing it."""
    global _checker
    install()
    _checker = helper_group


def _write_slot(state: bytes, text: str, members: str = "*") -> None:
    """The slot holds the state byte, who the collective waits on ("*", "0,2" or "?": a list
    too long for the slot counts as unknown), the task's collective count, then the text the
    reports show, separated by unit separators."""
    if _slot is not None:
        if len(members) > _SLOT_BYTES // 2:
            members = "?"
        fields = f"{members}\x1f{_count}\x1f{text}".encode()
        data = (state + fields)[: _SLOT_BYTES - 1]
        _slot[:] = data + b"\0" * (_SLOT_BYTES - len(data))


def _wrap(name: str, fn: Any) -> Any:
    def traced(*args: Any, **kwargs: Any) -> Any:
        global _count, _failed
        _count += 1
        fault = faults.due_at_collective(_count) if faults._armed else None
        call = _bind(name, fn, args, kwargs)
        signature = _describe(name, call)
        for log in _recorders:
            log.append(signature)
        members = _members(name, call)
        on_world = members == "*"  # (point-to-point ops name their peer: never fingerprinted)
        async_op = name in _NONBLOCKING or bool(call.get("async_op"))
        if _slot is not None:
            # Inside until the call returns (the fingerprint check blocks even for an async
            # op); an async op then counts as inside again while its Work is waited on
            # (``_traced_wait``). A blocking send or recv waits on its one peer.
            _write_slot(_STATE_INSIDE, f"#{_count} {signature} at {_call_site()}", members)
        try:
            if _checker is not None and name not in _UNCHECKED and on_world:
                agreed = {k: v for k, v in call.items() if k != _OWN_PART.get(name)}
                fingerprint = _describe(name, agreed, shapes=name not in _NAME_ONLY)
                _check_fingerprint(fingerprint)
            if fault is not None:  # every rank has entered this collective (checked above)
                where = f"collective #{_count} {signature}"
                return faults.fire(fault, where, lambda: fn(*args, **kwargs))
            result = fn(*args, **kwargs)
            if async_op and _slot is not None:
                for work in result if isinstance(result, list) else [result]:
                    if work is not None:
                        _in_flight[work] = (members, f"#{_count} {signature} (async, in wait())")
            return result
        except BaseException as exc:
            _failed = (exc, f"#{_count} {signature}")
            raise
        finally:
            if _slot is not None and _slot[:1] != _STATE_OUTSIDE:
                _slot[:1] = _STATE_OUTSIDE

    traced.__wrapped__ = fn  # type: ignore[attr-defined]
    traced.__name__ = name
    traced.__doc__ = fn.__doc__
    return traced


def _call_site() -> str:
    """Where the code that called the traced function is: "file.py:12 in step"."""
    caller = sys._getframe(2)
    return f"{caller.f_code.co_filename}:{caller.f_lineno} in {caller.f_code.co_name}"


def _traced_wait(work: Any, *args: Any, **kwargs: Any) -> Any:  # (Work.wait's signature)
    """``Work.wait`` that marks the rank as inside the async collective it waits on, so a peer
    that never joins it is reported as fast as for a blocking call."""
    global _failed
    entry = _in_flight.get(work) if _slot is not None else None
    if entry is None:
        return _original_wait(work, *args, **kwargs)
    members, label = entry
    _write_slot(_STATE_INSIDE, f"{label} at {_call_site()}", members)
    try:
        done = _original_wait(work, *args, **kwargs)
    except BaseException as exc:
        _in_flight.pop(work, None)
        _failed = (exc, label)
        raise
    finally:
        if _slot is not None and _slot[:1] != _STATE_OUTSIDE:
            _slot[:1] = _STATE_OUTSIDE
    if work.is_completed():  # (a wait with a timeout may return before: waited on again)
        _in_flight.pop(work, None)
    return done


def install(slot_path: str | None = None) -> None:
    """Trace ``torch.distributed``'s collectives in this process (idempotent).

    With ``slot_path`` the last collective entered is also kept in that file.
    """
    global _installed, _slot
    import torch.distributed as dist

    if slot_path is not None and _slot is None:
        with open(slot_path, "w+b") as f:
            f.truncate(_SLOT_BYTES)
            _slot = mmap.mmap(f.fileno(), _SLOT_BYTES)
        _write_slot(_STATE_OUTSIDE, "")
    if _installed:
        return
    for name in _COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _wrap(name, getattr(dist, name)))
    global _original_wait
    _original_wait = dist.Work.wait  # public class; a subclass's own wait() is left alone
    dist.Work.wait = _traced_wait
    _installed = True


class SlotReading(NamedTuple):
    last: str  # "#3 barrier() at file.py:12 in step", or "" before the first collective
    inside: bool  # still blocked in it
    on_world: bool  # it involves every rank of the default group
    members: frozenset[int] | None = None  # else the global ranks it needs; None if unknown
    entered: int = 0  # collectives the rank entered in the task so far


def read_slot(slot_path: str) -> SlotReading:
    """The last collective a rank entered, as written to its slot file. The rank may be
    writing it meanwhile: a torn read gives a garbled text and unknown members, never an
    error."""
    try:
        with open(slot_path, "rb") as f:
            data = f.read(_SLOT_BYTES)
    except OSError:
        return SlotReading("", False, False)
    state, rest = data[:1], data[1:].split(b"\0", 1)[0].decode(errors="replace")
    who, _, rest = rest.partition("\x1f")
    count, _, text = rest.partition("\x1f")
    members = None
    try:
        if who not in ("*", "?", ""):
            members = frozenset(int(r) for r in who.split(","))
        entered = int(count or 0)
    except ValueError:
        members, entered = None, 0
    # Who the collective waits on stays written after it returned or raised (only the state
    # byte is reset): a failed rank's report can still tell which ranks its collective needed.
    return SlotReading(text, state != _STATE_OUTSIDE, who == "*", members, entered)


@contextlib.contextmanager
def record_collectives() -> Iterator[list[str]]:
    """Collect the signature of every collective issued inside: name, shapes and dtypes, and
    with defaults filled in the reduce op, the src/dst root and the group when not the world."""
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


def slot_path_for(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.collective")
