"""Assertions a distributed test makes on every rank: replicas equal, and a distributed result
equal to one process's on the global batch.

Both are collective (every rank must call them, in the same place) and fail on every rank with
the same one-paragraph message, naming the first tensor that differs and the ranks it differs
on, so the report reads the same whichever rank pytest shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = [(f"parameter {n}", p) for n, p in module.named_parameters()]
    return named + [(f"buffer {n}", b) for n, b in module.named_buffers()]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor shard: compare what this rank holds
    return (to_local() if to_local is not None else t).detach()


def assert_replicas_equal(module: nn.Module, group: Any = None) -> None:
    """Every rank's ``module`` holds the same parameters and buffers, bit for bit.

    Raises AssertionError on every rank otherwise, naming the first tensor that differs from
    rank 0's and the ranks that hold it differently (by value, or by name, shape or dtype).
    """
    __tracebackhide__ = True
    named = [(n, _local(t)) for n, t in _named_tensors(module)]
    layout = [(n, tuple(t.shape), str(t.dtype)) for n, t in named]
    layouts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(layouts, layout, group=group)
    differ = [r for r, theirs in enumerate(layouts) if theirs != layouts[0]]
    if differ:
        theirs, other = layouts[differ[0]], differ[0]
        first = next((f"rank 0 {a} vs rank {other} {b}"
                      for a, b in zip(layouts[0], theirs, strict=False) if a != b),
                     f"rank 0 {len(layouts[0])} tensors vs rank {other} {len(theirs)}")  # fmt: skip
        raise AssertionError(
            f"replicas differ: rank(s) {differ} hold other tensors than rank 0 (first: {first})"
        )
    mine_differs: str | None = None
    for name, tensor in named:
        theirs = tensor.clone()
        dist.broadcast(theirs, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        if mine_differs is None and not torch.equal(tensor, theirs):
            diff = (tensor.double() - theirs.double()).abs().max().item()
            mine_differs = f"{name} (max abs difference {diff:.3g})"
    verdicts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, mine_differs, group=group)
    differ = [r for r, v in enumerate(verdicts) if v is not None]
    if differ:
        order = {n: i for i, (n, _) in enumerate(named)}
        first = min(differ, key=lambda r: order[verdicts[r].split(" (", 1)[0]])
        name = verdicts[first].split(" (", 1)[0]
        on = [r for r in differ if verdicts[r].split(" (", 1)[0] == name]
        raise AssertionError(
            f"replicas differ: {name} on rank(s) {on} is not rank 0's "
            f"({verdicts[first].split(' (', 1)[1]}"
        )


# Default tolerances by dtype (as torch.testing.assert_close's): a distributed reduction adds in
# another order than one process does, so float results differ by rounding, not more.
TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, nn.Module):
        value = {n: t for n, t in _named_tensors(value)}
    if isinstance(value, Mapping):
        for key in value:
            yield from _leaves(value[key], f"{path}[{key!r}]" if path else str(key))
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path or "result", value


def _compare(name: str, got: Any, want: Any, rtol: float | None, atol: float | None) -> str:
    """Why ``got`` is not ``want`` within tolerance, or ''."""
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return "" if got == want else f"{name}: {got!r} != {want!r}"
    got, want = _local(got), _local(want).to(got.device)
    if got.shape != want.shape or got.dtype != want.dtype:
        return (f"{name}: {tuple(got.shape)}:{got.dtype} vs one process's "
                f"{tuple(want.shape)}:{want.dtype}")  # fmt: skip
    default = TOLERANCES.get(got.dtype, (0.0, 0.0))
    r, a = default[0] if rtol is None else rtol, default[1] if atol is None else atol
    if torch.allclose(got, want, rtol=r, atol=a, equal_nan=True):
        return ""
    diff = (got.double() - want.double()).abs().max().item()
    return f"{name}: max abs difference {diff:.3g} (rtol={r:g}, atol={a:g} for {got.dtype})"


def assert_matches_single_process(
    distributed: Any,
    single_process: Any,
    rtol: float | None = None,
    atol: float | None = None,
    group: Any = None,
) -> None:
    """A distributed result equals one process's on the global batch, within tolerances that
    follow the dtype (float16, bfloat16, float32, float64; exact for the rest).

    ``distributed`` and ``single_process`` are tensors, modules (parameters and buffers
    compared), or dicts / lists / tuples of them, with the same structure. Call it on every
    rank; it raises on every rank, naming the first entry that differs and on which ranks.
    """
    __tracebackhide__ = True
    got, want = dict(_leaves(distributed, "")), dict(_leaves(single_process, ""))
    problem = ""
    if got.keys() != want.keys():
        problem = f"entries differ: {sorted(got.keys() ^ want.keys())[:3]}"
    else:
        problem = next((p for n in got if (p := _compare(n, got[n], want[n], rtol, atol))), "")
    verdicts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, problem, group=group)
    differ = [r for r, v in enumerate(verdicts) if v]
    if differ:
        raise AssertionError(
            f"does not match one process on the global batch on rank(s) {differ}: "
            f"{verdicts[differ[0]]}"
        )
