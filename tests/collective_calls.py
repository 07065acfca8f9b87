"""The space of calls the harness's collective check judges, and what the right verdict is.

A ``Case`` is one collective and, for each rank, the call it makes (``Call``): its group (the
default group through ``torch.distributed``'s function, ``"pg"`` the same group through its
object's method, ``"new"`` a ``new_group`` of every rank, ``"sub"`` ``new_group([0, 1])``),
blocking or async, dtypes, shapes, reduce op, root, list entries' sizes, split sizes, object
counts. Each call is valid on its own rank (what torch checks on one rank is torch's
business); the ranks' calls may differ. ``run_case`` makes the calls on the ranks; ``cases``
draws them (hypothesis); ``oracle`` says, from each collective's documented semantics and not
from the harness's code, what must happen: the call completes with the right data, the
harness reports a mismatch naming what differs, or torch refuses the call itself (gloo's own
limits, below).

What the documentation says must agree across the ranks of a group, by collective (``RULES``):
the group; the reduce op; the root; dtypes; all_reduce's, reduce's, gather's and scatter's
tensor shape, all_gather_into_tensor's input's and reduce_scatter_tensor's output's; broadcast's and a point-to-point pair's element count (torch documents "the same
number of elements"); all_gather's and reduce_scatter's list (every rank passes the same list
of parts, a rank's own part is its entry); broadcast_object_list's list length; all_to_all's
split sizes, pairwise (rank i's part for rank j is the size rank j expects from rank i). What
may differ: async_op, broadcast's shape at an equal element count, parts of different sizes
in one list, object sizes, all_to_all_single's uneven splits, whether all_gather_into_tensor's
output and reduce_scatter_tensor's input are the parts concatenated or stacked. gloo's limits: all_gather's and
all_to_all's list entries must all be the size of the rank's own first, and the whole tensor of
all_gather_into_tensor and reduce_scatter_tensor the parts concatenated, not stacked (gloo
refuses the others on the rank that makes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import strategies as st

from refddp.testing.checks.fingerprint import CollectiveMismatch

DTYPES = ("float32", "int32", "float64")  # float32 and int32: one size, bytes reinterpreted
SHAPES = ((2,), (3,), (1, 2), (2, 1), (4,))
OPS = ("SUM", "MAX")
POINT_TO_POINT = ("send_recv", "batch_isend_irecv")
GROUPS_OF_EVERY_RANK = ("world", "pg", "new")

# What every rank of the group must pass alike, by collective (the documented semantics).
RULES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("group", "dtype", "shape", "op"),
    "reduce": ("group", "dtype", "shape", "op", "dst"),
    "broadcast": ("group", "dtype", "numel", "src"),
    "all_gather": ("group", "dtype", "list"),
    "all_gather_into_tensor": ("group", "dtype", "shape"),  # the input's; the output's form free
    "all_gather_object": ("group",),
    "gather": ("group", "dtype", "shape", "dst"),
    "scatter": ("group", "dtype", "shape", "src"),
    "reduce_scatter": ("group", "dtype", "list", "op"),
    "reduce_scatter_tensor": ("group", "dtype", "shape", "op"),  # the output's; the input's form free
    "all_to_all": ("group", "dtype", "pairs"),
    "all_to_all_single": ("group", "dtype", "width", "pairs"),
    "barrier": ("group",),
    "broadcast_object_list": ("group", "length", "src"),
    "gather_object": ("group", "dst"),
    "scatter_object_list": ("group", "src"),
    "send_recv": ("dtype", "numel"),  # the sender's tensor against the receiver's
    "batch_isend_irecv": ("dtype", "numel"),  # each direction
}
COLLECTIVES = tuple(RULES)


@dataclass(frozen=True)
class Call:
    """One rank's call. ``sends``: list entries' sizes (all_gather, reduce_scatter) or what it
    sends each rank (all_to_all); ``recvs``: what it expects from each; empty for
    all_to_all_single's even split (``length`` rows each). ``recv_dtype`` / ``recv_shape``: the
    receiving side of a point-to-point call."""

    group: str = "world"  # world | pg | new | sub | idle (not in the subgroup)
    async_op: bool = False
    dtype: str = "float32"
    shape: tuple[int, ...] = (2,)
    op: str = "SUM"
    root: int = 0
    sends: tuple[int, ...] = ()
    recvs: tuple[int, ...] = ()
    width: int = 1
    length: int = 1
    recv_dtype: str = "float32"
    recv_shape: tuple[int, ...] = (2,)
    stacked: bool = False  # all_gather_into_tensor's output, reduce_scatter_tensor's input:
    # every rank's part stacked (W, *shape), not concatenated along the first dimension
    collective: str = ""  # another collective than the case's


@dataclass(frozen=True)
class Case:
    collective: str
    calls: tuple[Call, ...]

    def members(self) -> list[int]:
        return [r for r, c in enumerate(self.calls) if c.group != "idle"]


@dataclass(frozen=True)
class Verdict:
    kind: str  # pass | mismatch | refused (torch's own error)
    values: tuple = ()  # pass: what each rank's run_case returns
    tokens: tuple[tuple[int, str], ...] = ()  # mismatch: (rank, text its call's line must hold)
    aborts: bool = False  # or gloo may abort the receiver first (a documented limit)


# -- the rank side -----------------------------------------------------------------------------


def _full(shape: tuple[int, ...], value: float, dtype: str) -> torch.Tensor:
    return torch.full(shape, value, dtype=getattr(torch, dtype))


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


def _part(sender: int, receiver: int) -> int:
    """The value sender's part for receiver holds."""
    return 10 * (sender + 1) + receiver


def _options(kind: str, **fields: Any) -> Any:
    opts = getattr(dist, kind)()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _method(pg: Any, *names: str) -> Any:
    """The first of ``names`` this torch's process group has (2.13 renamed some)."""
    return next(getattr(pg, n) for n in names if hasattr(pg, n))


def run_case(case: Case) -> Any:
    """This rank's call of ``case``; its output, or ``("mismatch", message)`` where the check
    raised on every rank (then the pool is still sound: nothing reached torch)."""
    rank = dist.get_rank()
    groups = {"world": None, "pg": dist.group.WORLD}
    if any(c.group == "new" for c in case.calls):
        groups["new"] = dist.new_group()  # (a collective: every rank makes it)
    if any(c.group == "sub" for c in case.calls):
        groups["sub"] = dist.new_group([0, 1])
    call = case.calls[rank]
    if call.group == "idle":
        return None
    symmetric = case.collective not in POINT_TO_POINT and (
        all(c.group in GROUPS_OF_EVERY_RANK for c in case.calls)
        or all(c.group in ("sub", "idle") for c in case.calls))  # fmt: skip
    try:
        return _issue(call.collective or case.collective, call, groups[call.group],
                      call.group == "pg", rank, len(case.members()))  # fmt: skip
    except CollectiveMismatch as exc:
        if not symmetric:  # a peer is left waiting: the report is the driver's
            raise
        return ("mismatch", str(exc))
    except RuntimeError as exc:
        if "does not support" in str(exc):  # (torch 2.5's gloo has no reduce_scatter)
            return ("unsupported", str(exc))
        raise


def _wait(work: Any, call: Call) -> None:
    if work is not None and (call.async_op or call.group == "pg"):
        work.wait()


def _issue(name: str, c: Call, group: Any, method: bool, r: int, size: int) -> Any:  # noqa: C901
    """One rank's call of collective ``name``: a group method where ``method``, else the
    ``torch.distributed`` function (``async_op`` as drawn)."""
    a, op = c.async_op, getattr(dist.ReduceOp, c.op)
    pg = dist.group.WORLD if method else None
    if name in ("all_reduce", "reduce", "broadcast"):
        t = _full(c.shape, r + 1, c.dtype)
        if name == "all_reduce":
            work = (pg.allreduce([t], _options("AllreduceOptions", reduceOp=op)) if method
                    else dist.all_reduce(t, op=op, group=group, async_op=a))  # fmt: skip
        elif name == "reduce":
            work = (pg.reduce([t], _options("ReduceOptions", reduceOp=op, rootRank=c.root))
                    if method else dist.reduce(t, c.root, op=op, group=group, async_op=a))  # fmt: skip
        else:
            work = (pg.broadcast([t], _options("BroadcastOptions", rootRank=c.root)) if method
                    else dist.broadcast(t, c.root, group=group, async_op=a))  # fmt: skip
        _wait(work, c)
        return None if name == "reduce" and r != c.root else t.tolist()
    if name in ("all_gather", "reduce_scatter"):
        parts = [_full((n,), _part(r, j), c.dtype) for j, n in enumerate(c.sends)]
        if name == "all_gather":
            own, out = _full((c.sends[r],), r + 1, c.dtype), [torch.zeros_like(p) for p in parts]
            work = (pg.allgather([out], [own]) if method
                    else dist.all_gather(out, own, group=group, async_op=a))  # fmt: skip
            _wait(work, c)
            return [t.tolist() for t in out]
        own = _full((c.sends[r],), 0, c.dtype)
        work = (pg.reduce_scatter([own], [parts], _options("ReduceScatterOptions", reduceOp=op))
                if method else dist.reduce_scatter(own, parts, op=op, group=group, async_op=a))  # fmt: skip
        _wait(work, c)
        return own.tolist()
    whole_shape = (size, *c.shape) if c.stacked else (size * c.shape[0], *c.shape[1:])
    if name == "all_gather_into_tensor":
        own, out = _full(c.shape, r + 1, c.dtype), _full(whole_shape, 0, c.dtype)
        work = (_method(pg, "all_gather_single", "_allgather_base")(out, own) if method
                else dist.all_gather_into_tensor(out, own, group=group, async_op=a))  # fmt: skip
        _wait(work, c)
        return out.flatten().tolist()
    if name == "reduce_scatter_tensor":
        parts = [_full(c.shape, _part(r, j), c.dtype) for j in range(size)]
        whole = torch.stack(parts) if c.stacked else torch.cat(parts)
        own = _full(c.shape, 0, c.dtype)
        work = (_method(pg, "reduce_scatter_single", "_reduce_scatter_base")(
                    own, whole, _options("ReduceScatterOptions", reduceOp=op)) if method
                else dist.reduce_scatter_tensor(own, whole, op=op, group=group, async_op=a))  # fmt: skip
        _wait(work, c)
        return own.tolist()
    if name in ("gather", "scatter"):
        mine = _full(c.shape, r + 1 if name == "gather" else 0, c.dtype)
        parts = None
        if r == c.root:
            parts = [_full(c.shape, 0 if name == "gather" else _part(r, j), c.dtype)
                     for j in range(size)]  # fmt: skip
        if name == "gather":
            work = (pg.gather([parts] if parts else [], [mine],
                              _options("GatherOptions", rootRank=c.root)) if method
                    else dist.gather(mine, parts, c.root, group=group, async_op=a))  # fmt: skip
            _wait(work, c)
            return [t.tolist() for t in parts] if parts else None
        work = (pg.scatter([mine], [parts] if parts else [],
                           _options("ScatterOptions", rootRank=c.root)) if method
                else dist.scatter(mine, parts, c.root, group=group, async_op=a))  # fmt: skip
        _wait(work, c)
        return mine.tolist()
    if name == "all_to_all":
        ins = [_full((n,), _part(r, j), c.dtype) for j, n in enumerate(c.sends)]
        outs = [_full((n,), 0, c.dtype) for n in c.recvs]
        work = (pg.alltoall(outs, ins, _options("AllToAllOptions")) if method
                else dist.all_to_all(outs, ins, group=group, async_op=a))  # fmt: skip
        _wait(work, c)
        return [t.tolist() for t in outs]
    if name == "all_to_all_single":
        sends = list(c.sends) or [c.length] * size
        recvs = list(c.recvs) or [c.length] * size
        ins = torch.cat([_full((n, c.width), _part(r, j), c.dtype) for j, n in enumerate(sends)])
        out = _full((sum(recvs), c.width), 0, c.dtype)
        splits = (list(c.recvs) or None, list(c.sends) or None)
        work = (_method(pg, "all_to_all_single", "alltoall_base")(
                    out, ins, splits[0] or [], splits[1] or [], _options("AllToAllOptions"))
                if method else dist.all_to_all_single(out, ins, *splits, group=group,
                                                       async_op=a))  # fmt: skip
        _wait(work, c)
        return out.tolist()
    if name == "send_recv":  # rank 0 sends to rank 1
        if r == 0:
            t = _full(c.shape, 1, c.dtype)
            work = (pg.send([t], 1, 0) if method else
                    (dist.isend if a else dist.send)(t, 1, group=group))  # fmt: skip
            _wait(work, c)
            return None
        t = _full(c.recv_shape, 0, c.recv_dtype)
        work = (pg.recv([t], 0, 0) if method else
                (dist.irecv if a else dist.recv)(t, 0, group=group))  # fmt: skip
        _wait(work, c)
        return t.tolist()
    if name == "batch_isend_irecv":  # ranks 0 and 1 swap tensors
        sent, got = _full(c.shape, r + 1, c.dtype), _full(c.recv_shape, 0, c.recv_dtype)
        ops = [dist.P2POp(dist.isend, sent, 1 - r, group=pg), dist.P2POp(dist.irecv, got, 1 - r,
                                                                         group=pg)]  # fmt: skip
        for work in dist.batch_isend_irecv(ops if r == 0 else ops[::-1]):
            work.wait()
        return got.tolist()
    if name == "barrier":
        work = pg.barrier() if method else dist.barrier(group=group, async_op=a)
        _wait(work, c)
        return None
    objects_group = pg if method else group  # (no method form: the function on the object)
    if name == "all_gather_object":
        out = [None] * size
        dist.all_gather_object(out, [r] * c.length, group=objects_group)
        return out
    if name == "broadcast_object_list":
        objects = [10 * r + k for k in range(c.length)]
        dist.broadcast_object_list(objects, c.root, group=objects_group)
        return objects
    if name == "gather_object":
        out = [None] * size if r == c.root else None
        dist.gather_object([r] * c.length, out, c.root, group=objects_group)
        return out
    assert name == "scatter_object_list", name
    out = [None]
    ins = [[100 * r + j] for j in range(size)] if r == c.root else None
    dist.scatter_object_list(out, ins, c.root, group=objects_group)
    return out


# -- drawing cases -----------------------------------------------------------------------------


def _agreeing(draw: Any, name: str, size: int) -> list[Call]:
    """Every rank's call, all alike (as the documentation requires)."""
    dtype, shape = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES))
    base = Call(dtype=dtype, shape=shape, op=draw(st.sampled_from(OPS)),
                root=draw(st.integers(0, size - 1)), recv_dtype=dtype, recv_shape=shape,
                length=draw(st.integers(1, 3)), width=draw(st.integers(1, 2)))  # fmt: skip
    if name in ("all_gather", "reduce_scatter"):
        parts = draw(st.sampled_from([(2,) * size, (1,) * size, tuple(range(1, size + 1))]))
        base = replace(base, sends=parts)
    if name in ("all_to_all", "all_to_all_single"):
        sizes = (0, 1, 2) if name == "all_to_all_single" else (1, 2)
        even = draw(st.booleans())
        if even:
            n = draw(st.sampled_from(sizes[1:]))
            matrix = [[n] * size for _ in range(size)]
        else:
            matrix = [[draw(st.sampled_from(sizes)) for _ in range(size)] for _ in range(size)]
        if name == "all_to_all_single" and even:
            return [replace(base, length=matrix[0][0]) for _ in range(size)]
        return [replace(base, sends=tuple(matrix[r]), recvs=tuple(row[r] for row in matrix))
                for r in range(size)]  # fmt: skip
    return [base] * size


# What one rank may get wrong, by what RULES compares ("reshape": broadcast's shape at an equal
# element count; "length" of the object collectives: an object's size; both allowed).
_CHANGES = {"dtype": ("dtype",), "shape": ("shape", "reshape", "stacked"), "numel": ("shape", "reshape"),
            "op": ("op",), "src": ("root",), "dst": ("root",), "list": ("sends",),
            "pairs": ("sends", "recvs", "length"), "width": ("width",), "length": ("length",),
            "group": ("length",)}  # fmt: skip


def _perturbed(draw: Any, name: str, call: Call, size: int) -> Call:
    """``call`` with one thing changed, as one rank might get it wrong (or differently, where
    torch allows it)."""
    what = draw(st.sampled_from(sorted({c for rule in RULES[name] for c in _CHANGES[rule]})))
    if name in POINT_TO_POINT:  # the sending side or the receiving side
        if what == "dtype" and draw(st.booleans()):
            return replace(call, recv_dtype=draw(st.sampled_from(DTYPES)))
        if what in ("shape", "reshape"):
            return replace(call, recv_shape=draw(st.sampled_from(SHAPES)))
    if what == "dtype":
        return replace(call, dtype=draw(st.sampled_from(DTYPES)))
    if what == "stacked":  # (only these two take either form)
        return replace(call, stacked=name in ("all_gather_into_tensor", "reduce_scatter_tensor"))
    if what == "shape":
        return replace(call, shape=draw(st.sampled_from(SHAPES)))
    if what == "reshape":  # the same element count, another shape
        same = [s for s in SHAPES + ((2, 2),) if _numel(s) == _numel(call.shape)] or [call.shape]
        return replace(call, shape=draw(st.sampled_from(same)))
    if what == "op":
        return replace(call, op=draw(st.sampled_from(OPS)))
    if what == "root":
        return replace(call, root=draw(st.integers(0, size - 1)))
    if what in ("sends", "recvs") and getattr(call, what):
        sizes = list(getattr(call, what))
        sizes[draw(st.integers(0, size - 1))] = draw(st.integers(
            0 if name == "all_to_all_single" else 1, 2))  # fmt: skip
        return replace(call, **{what: tuple(sizes)})
    if what == "width":
        return replace(call, width=draw(st.integers(1, 2)))
    if what == "length" and (name != "all_to_all_single" or not call.sends):
        return replace(call, length=draw(st.integers(1, 3)))
    return call


@st.composite
def cases(draw: Any, name: str, size: int = 2, subgroup: bool = False) -> Case:
    """Each rank's call of collective ``name``: alike, then each rank's changed with some
    chance. With ``subgroup``, ranks 0 and 1 call on ``new_group([0, 1])`` (or one of them on a
    group of every rank, rank 2 waiting there too), else rank 2 is idle."""
    members = 2 if subgroup else size
    calls = _agreeing(draw, name, members)
    if subgroup:
        groups = draw(st.sampled_from([("sub", "sub"), ("sub", "sub"), ("sub", "world"),
                                       ("world", "sub")]))  # fmt: skip
    elif name in POINT_TO_POINT:  # (one group: a pair on two groups hangs, in torch too)
        groups = (draw(st.sampled_from(["world", "pg"])),) * size
    else:
        common = draw(st.sampled_from(GROUPS_OF_EVERY_RANK))
        groups = tuple(draw(st.sampled_from(GROUPS_OF_EVERY_RANK)) if draw(st.integers(0, 4)) == 0
                       else common for _ in range(size))  # fmt: skip
    out = []
    for rank in range(members):
        call = replace(calls[rank], group=groups[rank], async_op=draw(st.booleans()))
        if draw(st.booleans()):
            call = _perturbed(draw, name, call, members)
        out.append(call)
    if subgroup:  # rank 2 waits with the member on a group of every rank, if there is one
        out.append(Call(group="world", collective="barrier") if "world" in groups
                   else Call(group="idle"))  # fmt: skip
    elif name in POINT_TO_POINT:  # between ranks 0 and 1
        out[2:] = [Call(group="idle")] * (size - 2)
    return Case(name, tuple(out))


# -- the oracle --------------------------------------------------------------------------------


def _attribute(rule: str, call: Call, size: int) -> tuple[Any, tuple[str, ...]]:
    """A rank's value of what ``rule`` compares, and the texts the line naming its call must
    hold when the ranks differ in it."""
    if rule == "group":
        ranks = list(range(size)) if call.group == "new" else [0, 1]
        if call.group in ("world", "pg"):  # (one group: the default one, however it is named)
            return "world", ()
        return call.group, (f"group={ranks}",)
    if rule == "dtype":
        return call.dtype, (f":{call.dtype}",)
    if rule in ("shape", "numel"):
        return (call.shape if rule == "shape" else _numel(call.shape)), (str(call.shape),)
    if rule == "op":
        return call.op, (call.op,)
    if rule in ("src", "dst"):
        return call.root, (f"{rule}={call.root}",)
    if rule == "list":
        return call.sends, tuple(f"({n},)" for n in call.sends)
    if rule == "width":
        return call.width, (f", {call.width}):",)
    if rule == "length":
        return call.length, (f"{call.length} object(s)",)
    if rule == "pairs":  # compared apart: they pair up across ranks
        return None, ()
    raise AssertionError(rule)


ANYWHERE = -1  # a token the message must hold, on no rank's line in particular


def oracle(case: Case) -> Verdict:
    """What must happen, by the documented semantics (module docstring)."""
    name, members = case.collective, case.members()
    if any(case.calls[r].group == "sub" for r in members) and \
            any(case.calls[r].group != "sub" for r in members):  # fmt: skip
        sub = next(r for r in (0, 1) if case.calls[r].group == "sub")
        return Verdict("mismatch", tokens=((sub, "group=[0, 1]"), (1 - sub, f"{name}(")))
    if name in POINT_TO_POINT:
        return _point_to_point(case)
    calls = [case.calls[r] for r in members]
    size = len(calls)
    tokens = []
    for rule in RULES[name]:
        values = [_attribute(rule, c, size) for c in calls]
        if len({v for v, _ in values}) > 1:
            tokens += [(r, t) for r, (_, texts) in zip(members, values, strict=True) for t in texts]
    if name in ("all_to_all", "all_to_all_single") and not tokens:  # (checked once they agree)
        sends = [list(c.sends) or [c.length] * size for c in calls]
        recvs = [list(c.recvs) or [c.length] * size for c in calls]
        tokens += [(ANYWHERE, f"rank {members[i]} sends {sends[i][j]} to rank {members[j]}, "
                              f"which expects {recvs[j][i]}")
                   for i in range(size) for j in range(size) if sends[i][j] != recvs[j][i]][:1]
    if tokens:
        return Verdict("mismatch", tokens=tuple(tokens))
    if name == "all_gather" and len(set(calls[0].sends)) > 1:
        return Verdict("refused")  # gloo: every entry the size of the rank's own part
    if name == "all_to_all" and any(len(set(c.sends)) > 1 or len(set(c.recvs)) > 1
                                    for c in calls):  # fmt: skip
        return Verdict("refused")  # gloo: every entry the size of the rank's first
    if any(c.stacked for c in calls):
        return Verdict("refused")  # gloo: the whole tensor is the parts concatenated
    values = [None] * len(case.calls)
    for r, c in zip(members, calls, strict=True):
        values[r] = _expected(name, c, r, size, calls)
    return Verdict("pass", values=tuple(values))


def _point_to_point(case: Case) -> Verdict:
    c0, c1 = case.calls[0], case.calls[1]
    pairs = [((0, c0.dtype, c0.shape), (1, c1.recv_dtype, c1.recv_shape))]
    if case.collective == "batch_isend_irecv":
        pairs.append(((1, c1.dtype, c1.shape), (0, c0.recv_dtype, c0.recv_shape)))
    tokens, aborts = [], False
    for (sender, sent_dtype, sent_shape), (receiver, dtype, shape) in pairs:
        if sent_dtype != dtype or _numel(sent_shape) != _numel(shape):
            tokens += [(sender, f":{sent_dtype}"), (receiver, f":{dtype}")]
            # An async receive (irecv, a group's recv, a batch's) is compared at its wait
            # when its sender had not posted yet as it was issued; a larger message than its
            # buffer makes gloo abort the receiver first (checks/fingerprint.py says so).
            receiving = case.calls[receiver]
            asynchronous = case.collective == "batch_isend_irecv" or receiving.async_op or \
                receiving.group == "pg"  # fmt: skip
            sent_bytes = _numel(sent_shape) * _full((), 0, sent_dtype).element_size()
            aborts |= asynchronous and sent_bytes > _numel(shape) * _full((), 0, dtype).element_size()
    if tokens:
        return Verdict("mismatch", tokens=tuple(tokens), aborts=aborts)
    idle = (None,) * (len(case.calls) - 2)
    if case.collective == "send_recv":
        return Verdict("pass", values=(None, _full(c1.recv_shape, 1, "float64").tolist(), *idle))
    swapped = [_full(c.recv_shape, 2 - r, "float64").tolist() for r, c in enumerate((c0, c1))]
    return Verdict("pass", values=(*swapped, *idle))


def _reduced(values: list[int], op: str) -> int:
    return sum(values) if op == "SUM" else max(values)


def _expected(name: str, c: Call, r: int, size: int, calls: list[Call]) -> Any:  # noqa: C901
    """What rank ``r``'s ``run_case`` returns when the call completes with the right data."""
    def full(shape: tuple[int, ...], value: float) -> Any:
        return _full(shape, value, "float64").tolist()

    if name == "all_reduce":
        return full(c.shape, _reduced(list(range(1, size + 1)), c.op))
    if name == "reduce":
        return full(c.shape, _reduced(list(range(1, size + 1)), c.op)) if r == c.root else None
    if name == "broadcast":
        return full(c.shape, c.root + 1)
    if name == "all_gather":
        return [full((n,), j + 1) for j, n in enumerate(c.sends)]
    if name == "reduce_scatter":
        return full((c.sends[r],), _reduced([_part(i, r) for i in range(size)], c.op))
    if name == "all_gather_into_tensor":
        return [float(j + 1) for j in range(size) for _ in range(_numel(c.shape))]
    if name == "reduce_scatter_tensor":
        return full(c.shape, _reduced([_part(i, r) for i in range(size)], c.op))
    if name == "gather":
        return [full(c.shape, j + 1) for j in range(size)] if r == c.root else None
    if name == "scatter":
        return full(c.shape, _part(c.root, r))
    if name == "all_to_all":
        return [full((n,), _part(j, r)) for j, n in enumerate(c.recvs)]
    if name == "all_to_all_single":
        recvs = list(c.recvs) or [c.length] * size
        return [[float(_part(j, r))] * c.width for j, n in enumerate(recvs) for _ in range(n)]
    if name == "barrier":
        return None
    if name == "all_gather_object":
        return [[j] * calls[j].length for j in range(size)]
    if name == "broadcast_object_list":
        return [10 * c.root + k for k in range(c.length)]
    if name == "gather_object":
        return [[j] * calls[j].length for j in range(size)] if r == c.root else None
    assert name == "scatter_object_list", name
    return [[100 * c.root + r]]


# -- reading a mismatch ------------------------------------------------------------------------

_RUNNING = re.compile(r"(?:rank (\d+) is|ranks (\[[^\]]*\]) \(\d+\) are) running #\d+ ")


def lines_by_rank(message: str) -> dict[int, str]:
    """Each rank named in a ``Detected mismatch ...`` message -> the text of its call."""
    from refddp.testing.rank_lists import parse_rank_list

    found = list(_RUNNING.finditer(message))
    out = {}
    for match, following in zip(found, found[1:] + [None], strict=True):
        text = message[match.end(): following.start() if following else len(message)]
        for rank in [int(match[1])] if match[1] else parse_rank_list(match[2]):
            out[rank] = text
    return out
