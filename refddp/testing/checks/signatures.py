"""What the ranks of a group must agree on for each collective, and how a call is described.

Every collective a rank enters is described twice. For people, ``describe``: the record, the
slot and every report show the name, each tensor's shape and dtype, the reduce op, the root,
the group, all_to_all_single's split sizes and a point-to-point call's tag. For the check,
``fingerprint``: exactly what torch's documented semantics require every rank of the group to
pass alike (the table ``AGREE``), after defaults and aliases are filled in, so that
``all_reduce(t)`` and ``group.allreduce([t])`` agree, and the group by its ranks and the name
torch gave it (``group_name``: two ``new_group`` calls over the same ranks make two
communicators, which the descriptions show alike). What may differ between ranks stays out
of the fingerprint: async_op; the list only the root passes to gather and scatter; a rank's own
part of all_gather and reduce_scatter, whose size the list every rank passes decides (its dtype
is compared); the objects of the object collectives; and all_to_all's split sizes, which must
pair up instead (``pairing``: rank i's part for rank j is what rank j expects from rank i), a
cross-rank relation a hash cannot compare. Point-to-point calls compare their tensor's element
count and dtype with the peer's (``payload``).
"""

from __future__ import annotations

from typing import Any

SHAPE = "shape"  # shape and dtype
ELEMENTS = "elements"  # number of elements and dtype (broadcast: "the same number of elements")
DTYPE = "dtype"  # dtype alone: a rank's own part, sized as its entry of the list every rank passes
LIST = "list"  # each entry's shape and dtype
LENGTH = "length"  # the list's length
ROWS = "rows"  # dtype and every dimension but the first, which all_to_all_single splits
DTYPES = "dtypes"  # the list's length and its entries' dtypes (their sizes pair up instead)

# Argument -> how every rank's must agree, by collective (reduce op, root and group always).
# A collective missing here (a coalesced form) compares every tensor's shape and dtype.
AGREE: dict[str, dict[str, str]] = {
    "all_reduce": {"tensor": SHAPE},
    "reduce": {"tensor": SHAPE},
    "broadcast": {"tensor": ELEMENTS},
    "all_gather": {"tensor_list": LIST, "tensor": DTYPE},
    # The output: every rank's inputs concatenated or stacked, each rank's choice.
    "all_gather_into_tensor": {"output_tensor": ELEMENTS, "input_tensor": SHAPE},
    "all_gather_object": {},
    "gather": {"tensor": SHAPE},
    "scatter": {"tensor": SHAPE},
    "reduce_scatter": {"output": DTYPE, "input_list": LIST},
    "reduce_scatter_tensor": {"output": SHAPE, "input": ELEMENTS},  # (concatenated or stacked)
    "all_to_all": {"output_tensor_list": DTYPES, "input_tensor_list": DTYPES},
    "all_to_all_single": {"output": ROWS, "input": ROWS},
    "barrier": {},
    "broadcast_object_list": {"object_list": LENGTH},
    "gather_object": {},
    "scatter_object_list": {},
}
# Other names of one collective (torch 2.13 renamed the single-tensor forms).
ALIASES = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}
_ROOT_ARGS = (("src", "group_src"), ("dst", "group_dst"))


def canonical_name(name: str) -> str:
    return ALIASES.get(name, name)


def _tensor_text(t: Any, view: str = SHAPE) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    if view == DTYPE:
        return dtype
    if view == ELEMENTS:
        return f"{t.numel()}:{dtype}"
    if view == ROWS:
        return f"(*, {', '.join(map(str, t.shape[1:]))}):{dtype}"
    return f"{tuple(t.shape)}:{dtype}"


def shape_text(value: Any) -> str | None:
    """``(4,):float32`` for a tensor; ``[2x(2,):float32]`` for a list of alike tensors, each
    entry for a list of others; None for anything else."""
    import torch

    if isinstance(value, torch.Tensor):
        return _tensor_text(value)
    if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
        entries = [_tensor_text(t) for t in value]
        if len(set(entries)) == 1:
            return f"[{len(value)}x{entries[0]}]"
        return f"[{', '.join(entries)}]"
    return None


def _view_text(value: Any, view: str) -> str:
    import torch

    if view == LENGTH:
        return str(len(value)) if isinstance(value, list | tuple) else "-"
    if isinstance(value, torch.Tensor):
        return _tensor_text(value, view)
    if isinstance(value, list | tuple):
        if view == DTYPES:
            dtypes = sorted({_tensor_text(t, DTYPE) for t in value})
            return f"{len(value)}x{'|'.join(dtypes)}"
        return shape_text(value) or f"[{len(value)}]"
    return "-"


def op_name(op: Any) -> str:
    # ReduceOp.SUM is a RedOpType; ReduceOp(ReduceOp.SUM) wraps one in `.op`.
    return str(getattr(getattr(op, "op", op), "name", op))


def group_ranks(group: Any) -> list[int] | str | None:
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


def group_name(group: Any) -> str:
    """The number torch named a registered group with, other than the default group; "" for
    the default group, one torch never registered, one without a name, or one named by a hash.

    ``new_group`` numbers the groups it makes in the order made, and every rank of the world
    makes every group (a non-member too), so the same group has the same number on every rank
    and two groups over the same ranks differ in it alone. A hashed name
    (``use_local_synchronization``, ``split_group``) counts the groups each rank has seen,
    which may differ between ranks on NCCL's split path: not compared."""
    ranks = group_ranks(group)
    if not isinstance(ranks, list):
        return ""
    try:
        name = str(getattr(group, "group_name", "") or "")
    except RuntimeError:  # (a group torch has already destroyed)
        return ""
    return name if name.isdigit() else ""


def _root(call: dict[str, Any], plain: str, in_group: str) -> tuple[str, int] | None:
    """The call's root as a global rank (``src=2``), or as the group's rank where the group
    is one torch never registered (``group_src=1``)."""
    import torch.distributed as dist

    if call.get(plain) is not None:
        return plain, int(call[plain])
    if call.get(in_group) is None:
        return None
    group = call.get("group")
    if group is None or group is dist.group.WORLD:
        return plain, int(call[in_group])
    try:
        return plain, int(dist.get_global_rank(group, int(call[in_group])))
    except (KeyError, RuntimeError, ValueError):
        return in_group, int(call[in_group])


def peer(call: dict[str, Any], plain: str) -> int | None:
    """A point-to-point call's peer (``dst`` or ``src``) as a global rank; None for any source,
    or where the group's ranks are unknown."""
    root = _root(call, plain, f"group_{plain}")
    return root[1] if root is not None and root[0] == plain else None


def _common(call: dict[str, Any]) -> list[str]:
    """The reduce op, the root and the group: compared for every collective."""
    parts = []
    if "op" in call:
        parts.append(op_name(call["op"]))
    for plain, in_group in _ROOT_ARGS:
        root = _root(call, plain, in_group)
        if root is not None:
            parts.append(f"{root[0]}={root[1]}")
    ranks = group_ranks(call.get("group"))
    if ranks is not None:
        parts.append(f"group={ranks}")
    return parts


# What only a rooted collective's root passes (the other ranks pass None).
ROOT_ONLY = ("gather_list", "scatter_list", "object_gather_list", "scatter_object_input_list")


def describe(name: str, call: dict[str, Any], alike: bool = False) -> str:
    """``all_reduce((4,):float32, SUM)``, ``broadcast((4,):float32, src=1, group=[0, 2])``.
    ``alike``: without what only the root passes, so that every rank of a correct program
    describes a collective in the same words (``record_collectives``)."""
    parts = [text for key, value in call.items() if not (alike and key in ROOT_ONLY)
             for text in (shape_text(value),) if text is not None]  # fmt: skip
    if canonical_name(name) == "all_to_all_single":
        for key in ("output_split_sizes", "input_split_sizes"):
            if call.get(key):
                parts.append(f"{key}={list(map(int, call[key]))}")
    if name == "batch_isend_irecv":  # each op: "isend((2,):float32, dst=1)"
        for op in call.get("p2p_op_list") or ():
            kind = getattr(op.op, "__name__", "op")
            peer = "dst" if kind == "isend" else "src"
            parts.append(describe(kind, {"tensor": op.tensor, peer: op.peer, "group": op.group,
                                         "tag": getattr(op, "tag", 0)}))  # fmt: skip
    if name == "broadcast_object_list" and isinstance(call.get("object_list"), list | tuple):
        parts.append(f"{len(call['object_list'])} object(s)")
    tag = [f"tag={int(call['tag'])}"] if call.get("tag") else []  # a send's or receive's
    return f"{name}({', '.join(parts + _common(call) + tag)})"


def fingerprint(name: str, call: dict[str, Any], named: str = "") -> str:
    """What every rank of the group must pass alike for this collective, as text (``named``:
    its group's ``group_name``)."""
    name = canonical_name(name)
    views = AGREE.get(name)
    if views is None:
        parts = [s for s in map(shape_text, call.values()) if s is not None]
    else:
        parts = [f"{arg}={_view_text(call.get(arg), view)}" for arg, view in views.items()]
    # Which of the groups over these ranks: the same ranks' two groups are two communicators.
    return f"{name}({', '.join(parts + _common(call) + ([f'name={named}'] if named else []))})"


def _splits(given: Any, tensor: Any, size: int) -> list[int]:
    if given:
        return [int(s) for s in given]
    rows = int(tensor.shape[0]) if tensor is not None and tensor.dim() else 0
    return [rows // size] * size  # (torch refuses rows that do not divide, on that rank)


def pairing(name: str, call: dict[str, Any], size: int) -> tuple[list[int], list[int]] | None:
    """For all_to_all: what this rank sends each rank of the group and what it expects from
    each (elements per list entry; all_to_all_single: rows), else None."""
    name = canonical_name(name)
    if name == "all_to_all":
        sends = [t.numel() for t in call.get("input_tensor_list") or ()]
        recvs = [t.numel() for t in call.get("output_tensor_list") or ()]
    elif name == "all_to_all_single":
        sends = _splits(call.get("input_split_sizes"), call.get("input"), size)
        recvs = _splits(call.get("output_split_sizes"), call.get("output"), size)
    else:
        return None
    fit = lambda sizes: (sizes + [-1] * size)[:size]  # noqa: E731 - a list of another length: -1s
    return fit(sends), fit(recvs)


def unpaired(sends: list[list[int]], recvs: list[list[int]], ranks: list[int]) -> str:
    """"" when every rank's part for each rank is the size that rank expects from it, else the
    first few that are not, as a sentence."""
    faults = [
        f"rank {ranks[i]} sends {sends[i][j]} to rank {ranks[j]}, which expects {recvs[j][i]}"
        for i in range(len(ranks))
        for j in range(len(ranks))
        if sends[i][j] != recvs[j][i]
    ]
    more = f" (and {len(faults) - 4} more)" if len(faults) > 4 else ""
    return "; ".join(faults[:4]) + more


def payload(call: dict[str, Any]) -> str:
    """What a send and its receive must agree on: the tensor's element count and dtype."""
    tensor = call.get("tensor")
    return _tensor_text(tensor, ELEMENTS) if tensor is not None else "-"
