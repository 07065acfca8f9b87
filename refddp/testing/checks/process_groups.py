"""Collectives called on a process-group object, traced like ``torch.distributed``'s functions.

PyTorch's own tests, and code written in their style, call a group's methods directly:
``pg.broadcast([t], opts)``, ``pg.allreduce([t])``, ``pg.barrier()``, where ``pg`` is the
default group (``dist.group.WORLD``), a ``dist.new_group()`` or a backend object built directly
(``dist.ProcessGroupGloo(store, rank, size)``). Those calls never pass through the functions
``collectives.py`` wraps, so ``ProcessGroup``'s methods (and those of each public backend class:
``ProcessGroupGloo``, ``ProcessGroupNCCL``...) are wrapped too. Each call is translated into
the ``torch.distributed`` function it stands for, with that function's argument names (the
overloads of each method, options objects and group ranks read into ``src``/``dst`` global
ranks), so that it is counted, recorded, shown and checked exactly as that function is:
``pg.allreduce([t])`` on one rank and ``dist.all_reduce(t)`` on another agree.

Every method name is looked for on the class (torch 2.5 has ``alltoall_base`` and
``_allgather_base``, 2.13 also ``all_to_all_single`` and ``all_gather_single``); one that is
missing is not wrapped. ``torch.distributed``'s functions call these methods themselves
(``dist.all_reduce`` calls ``group.allreduce``): such a nested call is left to the function's
own record (``collectives.py``'s guard), so that one collective is counted once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Parsed = tuple[str, dict[str, Any]]

BACKEND_CLASSES = ("ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupMPI", "ProcessGroupUCC",
                   "ProcessGroupXCCL")  # fmt: skip


def _arg(args: tuple, kwargs: dict, index: int, *names: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return default


def _one(tensors: Any) -> Any:
    """The tensor of a list of one (the multi-device form's list), else the value itself."""
    if isinstance(tensors, list | tuple) and len(tensors) == 1:
        return tensors[0]
    return tensors


def _inner(lists: Any) -> Any:
    """The list of a list of one list (``[[t0, t1]]``), else the value itself."""
    if isinstance(lists, list | tuple) and len(lists) == 1 and isinstance(lists[0], list | tuple):
        return list(lists[0])
    return lists


def _options(value: Any, field: str) -> Any:
    """``value.field`` for a torch options object (``AllreduceOptions``...), else None."""
    return getattr(value, field, None) if type(value).__name__.endswith("Options") else None


def _first(*values: Any) -> Any:
    """The first value that is not None (a reduce op may be falsy: ``RedOpType.SUM`` is 0)."""
    return next((v for v in values if v is not None), None)


def _sum() -> Any:
    import torch.distributed as dist

    return dist.ReduceOp.SUM


def _allreduce(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    second = _arg(args, kwargs, 1, "opts", "op")
    return "all_reduce", {"tensor": _one(_arg(args, kwargs, 0, "tensors", "tensor")),
                          "op": _first(_options(second, "reduceOp"), second, _sum())}  # fmt: skip


def _broadcast(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    second = _arg(args, kwargs, 1, "opts", "root", default=0)
    root = _first(_options(second, "rootRank"), second)
    return "broadcast", {"tensor": _one(_arg(args, kwargs, 0, "tensors", "tensor")),
                         "group_src": root}  # fmt: skip


def _reduce(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    second = _arg(args, kwargs, 1, "opts", "root", default=0)
    if _options(second, "rootRank") is not None:
        root, op = second.rootRank, second.reduceOp
    else:
        root, op = second, _first(_arg(args, kwargs, 2, "op"), _sum())
    return "reduce", {"tensor": _one(_arg(args, kwargs, 0, "tensors", "tensor")), "op": op,
                      "group_dst": root}  # fmt: skip


def _allgather(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    outputs = _inner(_arg(args, kwargs, 0, "output_tensors"))
    inputs = _arg(args, kwargs, 1, "input_tensors", "input_tensor")
    return "all_gather", {"tensor_list": outputs, "tensor": _one(inputs)}


def _allgather_into_tensor(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    output, input_ = _arg(args, kwargs, 0, "output"), _arg(args, kwargs, 1, "input")
    return "all_gather_into_tensor", {"output_tensor": output, "input_tensor": input_}


def _rooted(lists: Any, tensors: Any, third: Any) -> tuple[Any, Any, Any]:
    """gather's and scatter's two overloads: (lists, tensors, options) or (list, tensor, root)."""
    root = _first(_options(third, "rootRank"), third, 0)
    return _inner(lists), _one(tensors), root


def _gather(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    lists, tensor, root = _rooted(_arg(args, kwargs, 0, "output_tensors"),
                                  _arg(args, kwargs, 1, "input_tensors", "input_tensor"),
                                  _arg(args, kwargs, 2, "opts", "root"))  # fmt: skip
    return "gather", {"tensor": tensor, "gather_list": lists or None, "group_dst": root}


def _scatter(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    lists, tensor, root = _rooted(_arg(args, kwargs, 1, "input_tensors"),
                                  _arg(args, kwargs, 0, "output_tensors", "output_tensor"),
                                  _arg(args, kwargs, 2, "opts", "root"))  # fmt: skip
    return "scatter", {"tensor": tensor, "scatter_list": lists or None, "group_src": root}


def _reduce_scatter(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    third = _arg(args, kwargs, 2, "opts", "op")
    op = _first(_options(third, "reduceOp"), third, _sum())
    output = _one(_arg(args, kwargs, 0, "output_tensors", "output"))
    inputs = _inner(_arg(args, kwargs, 1, "input_tensors", "input"))
    return "reduce_scatter", {"output": output, "input_list": inputs, "op": op}


def _reduce_scatter_into_tensor(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    op = _first(_options(_arg(args, kwargs, 2, "opts"), "reduceOp"), _sum())
    output = _arg(args, kwargs, 0, "outputTensor", "output")
    input_ = _arg(args, kwargs, 1, "inputTensor", "input")
    return "reduce_scatter_tensor", {"output": output, "input": input_, "op": op}


def _alltoall(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    outputs = _arg(args, kwargs, 0, "output_tensors", "output_tensor")
    inputs = _arg(args, kwargs, 1, "input_tensors", "input_tensor")
    return "all_to_all", {"output_tensor_list": outputs, "input_tensor_list": inputs}


def _alltoall_base(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    return "all_to_all_single", {
        "output": _arg(args, kwargs, 0, "output"),
        "input": _arg(args, kwargs, 1, "input"),
        "output_split_sizes": _arg(args, kwargs, 2, "output_split_sizes"),
        "input_split_sizes": _arg(args, kwargs, 3, "input_split_sizes"),
    }


def _send(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    tensor, tag = _one(_arg(args, kwargs, 0, "tensors")), _arg(args, kwargs, 2, "tag")
    return "isend", {"tensor": tensor, "group_dst": _arg(args, kwargs, 1, "dstRank"), "tag": tag}


def _recv(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    tensor, tag = _one(_arg(args, kwargs, 0, "tensors")), _arg(args, kwargs, 2, "tag")
    return "irecv", {"tensor": tensor, "group_src": _arg(args, kwargs, 1, "srcRank"), "tag": tag}


def _recv_anysource(pg: Any, args: tuple, kwargs: dict) -> Parsed:
    return "irecv", {"tensor": _one(_arg(args, kwargs, 0, "arg0")), "src": None,
                     "tag": _arg(args, kwargs, 1, "arg1")}  # fmt: skip


def _no_arguments(name: str) -> Callable[[Any, tuple, dict], Parsed]:
    return lambda pg, args, kwargs: (name, {})


def _tensors_and_op(name: str) -> Callable[[Any, tuple, dict], Parsed]:
    """A coalesced form: its tensor lists (every shape and dtype compared) and reduce op."""

    def parse(pg: Any, args: tuple, kwargs: dict) -> Parsed:
        lists = [_inner(a) for a in args if isinstance(a, list | tuple)]
        call: dict[str, Any] = {f"tensors{i}": v for i, v in enumerate(lists)}
        op = _first(*[_options(a, "reduceOp") for a in args])
        return name, {**call, **({"op": op} if op is not None else {})}

    return parse


# Method -> how its call reads as the torch.distributed function it stands for.
METHODS: dict[str, Callable[[Any, tuple, dict], Parsed]] = {
    "allreduce": _allreduce,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "allgather": _allgather,
    "_allgather_base": _allgather_into_tensor,  # torch 2.5's all_gather_into_tensor
    "all_gather_single": _allgather_into_tensor,
    "gather": _gather,
    "scatter": _scatter,
    "reduce_scatter": _reduce_scatter,
    "_reduce_scatter_base": _reduce_scatter_into_tensor,  # torch 2.5's reduce_scatter_tensor
    "reduce_scatter_single": _reduce_scatter_into_tensor,
    "alltoall": _alltoall,
    "alltoall_base": _alltoall_base,
    "all_to_all_single": _alltoall_base,
    "send": _send,
    "recv": _recv,
    "recv_anysource": _recv_anysource,
    "barrier": _no_arguments("barrier"),
    "monitored_barrier": _no_arguments("monitored_barrier"),
    "allreduce_coalesced": _tensors_and_op("all_reduce_coalesced"),
    "allgather_coalesced": _tensors_and_op("all_gather_coalesced"),
    "allgather_into_tensor_coalesced": _tensors_and_op("all_gather_into_tensor_coalesced"),
    "reduce_scatter_tensor_coalesced": _tensors_and_op("reduce_scatter_tensor_coalesced"),
    "all_gather_single_coalesced": _tensors_and_op("all_gather_into_tensor_coalesced"),
    "reduce_scatter_single_coalesced": _tensors_and_op("reduce_scatter_tensor_coalesced"),
}


def classes() -> list[type]:
    """``ProcessGroup`` and each public backend class this torch has."""
    import torch.distributed as dist

    return [dist.ProcessGroup] + [getattr(dist, n) for n in BACKEND_CLASSES if hasattr(dist, n)]


def trace(enter: Callable[[str, dict[str, Any], Callable[[], Any]], Any],
          nested: Callable[[], bool]) -> None:  # fmt: skip
    """Wrap every collective method of the group classes: ``enter(name, call, run)`` records
    and checks the call as the function ``name`` with arguments ``call`` (``group`` added), then
    ``run()`` issues it; a call made ``nested()`` inside a traced one is issued as it is."""
    for cls in classes():
        for method, parse in METHODS.items():
            original = cls.__dict__.get(method) or getattr(cls, method, None)
            if original is None or getattr(original, "__refddp_traced__", False):
                continue
            setattr(cls, method, _traced_method(method, original, parse, enter, nested))


def _traced_method(method: str, original: Any, parse: Callable[[Any, tuple, dict], Parsed],
                   enter: Callable, nested: Callable[[], bool]) -> Callable:  # fmt: skip
    def traced(pg: Any, *args: Any, **kwargs: Any) -> Any:
        if nested():
            return original(pg, *args, **kwargs)
        try:
            name, call = parse(pg, args, kwargs)
        except (AttributeError, IndexError, TypeError, ValueError):  # torch raises its own error
            return original(pg, *args, **kwargs)
        call["group"], call["async_op"] = pg, True  # (every method returns a Work)
        return enter(name, call, lambda: original(pg, *args, **kwargs))

    traced.__refddp_traced__ = True  # type: ignore[attr-defined]
    traced.__name__ = method
    traced.__doc__ = original.__doc__
    return traced
