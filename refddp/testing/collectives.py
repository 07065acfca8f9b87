"""A record of the collectives this process issues through ``torch.distributed``.

Three uses: a hang report names the last collective each rank entered (written to a small
memory-mapped file the driver can read even while the rank is blocked); tests compare the
sequence each rank issued (``record_collectives``) to prove every rank takes the same path;
and, when enabled, every collective on the default group is first checked against the other
ranks' (``enable_fingerprint_check``), so a mismatch fails with both collectives named.

Why our own check rather than torch's: with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch wraps each
new group in ``ProcessGroupWrapper``, and in torch 2.13 constructing DDP on such a gloo group
segfaults (DDP's logger casts the wrapper to ProcessGroupGloo). This check also compares the
reduce op, which the wrapper's fingerprint leaves out.

Only calls made through the ``torch.distributed`` namespace are seen; DDP's gradient
all-reduce runs in C++ and shows up in the process group's sequence number instead
(``process_group_sequence``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from collections.abc import Iterator
from typing import Any

_COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
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
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
)
_SLOT_BYTES = 1024

# Ops whose tensors legitimately differ between ranks (uneven splits, src/dst-only lists):
# only their names are compared. Point-to-point ops pair different calls, so are not checked.
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
# monitored_barrier exists to name a missing rank; a fingerprint exchange would hang on it.
_UNCHECKED = {"send", "recv", "isend", "irecv", "batch_isend_irecv", "monitored_barrier"}
_FINGERPRINT_BYTES = 256

_installed = False
_slot: mmap.mmap | None = None
_recorders: list[list[str]] = []
_count = 0
_checked_count = 0
_checker: Any = None  # the helper process group fingerprints are exchanged on


class CollectiveMismatch(RuntimeError):
    """Ranks issued different collectives at the same point on the default group."""


def _describe(name: str, args: tuple, kwargs: dict) -> str:
    import torch

    parts = []
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            parts.append(f"{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}")
        elif isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
            parts.append(f"[{len(value)}x{tuple(value[0].shape)}]")
        elif hasattr(value, "name") and type(value).__name__ == "RedOpType":
            parts.append(value.name)
    return f"{name}({', '.join(parts)})"


def _on_default_group(args: tuple, kwargs: dict) -> bool:
    import torch.distributed as dist

    groups = [a for a in (*args, *kwargs.values()) if isinstance(a, dist.ProcessGroup)]
    default = dist.distributed_c10d._get_default_group()
    return all(g is default or g == dist.group.WORLD for g in groups)


def _check_fingerprint(name: str, signature: str) -> None:
    """All-gather this collective's fingerprint; raise on every rank if any rank differs."""
    import torch
    import torch.distributed as dist

    global _checked_count
    _checked_count += 1
    text = f"#{_checked_count} " + (name if name in _NAME_ONLY else signature)
    data = text.encode()[:_FINGERPRINT_BYTES].ljust(_FINGERPRINT_BYTES, b"\0")
    mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(_checker))]
    dist.distributed_c10d.all_gather(everyone, mine, group=_checker)
    seen = [bytes(t.tolist()).rstrip(b"\0").decode(errors="replace") for t in everyone]
    if len(set(seen)) > 1:
        listed = "; ".join(f"rank {r} is running {s}" for r, s in enumerate(seen))
        raise CollectiveMismatch(f"Detected mismatch between collectives on ranks: {listed}")


def reset_count() -> None:
    """Number fingerprints from 1 again (at the start of each harness task)."""
    global _checked_count
    _checked_count = 0


def enable_fingerprint_check(helper_group: Any) -> None:
    """Check each default-group collective against every rank's before issuing it."""
    global _checker
    install()
    _checker = helper_group


def _wrap(name: str, fn: Any) -> Any:
    def traced(*args: Any, **kwargs: Any) -> Any:
        global _count
        _count += 1
        signature = _describe(name, args, kwargs)
        for log in _recorders:
            log.append(signature)
        if _slot is not None:
            caller = sys._getframe(1)
            where = f"{caller.f_code.co_filename}:{caller.f_lineno} in {caller.f_code.co_name}"
            text = f"#{_count} {signature} at {where}".encode()[: _SLOT_BYTES - 1]
            _slot[:] = text + b"\0" * (_SLOT_BYTES - len(text))
        if _checker is not None and name not in _UNCHECKED and _on_default_group(args, kwargs):
            _check_fingerprint(name, signature)
        return fn(*args, **kwargs)

    traced.__wrapped__ = fn  # type: ignore[attr-defined]
    traced.__name__ = name
    traced.__doc__ = fn.__doc__
    return traced


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
    if _installed:
        return
    for name in _COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _wrap(name, getattr(dist, name)))
    _installed = True


def read_slot(slot_path: str) -> str:
    """The last collective a rank entered, as written to its slot file ('' if none)."""
    try:
        with open(slot_path, "rb") as f:
            return f.read(_SLOT_BYTES).split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def record_collectives() -> Iterator[list[str]]:
    """Collect the signature (name, shapes, dtype, op) of every collective issued inside."""
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
    group = dist.distributed_c10d._get_default_group()
    try:
        return int(group._get_sequence_number_for_group())
    except (AttributeError, RuntimeError):
        return None


def slot_path_for(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.collective")
