"""What a test leaves behind on a warm rank, found and cleaned after each task.

A pool's ranks live from test to test, so state a test builds and does not tear down would
reach the next one: device meshes (refddp's ``device_mesh`` list and torch's mesh stack),
process groups from ``dist.new_group`` (each holds sockets and threads), CUDA memory still
allocated. After each task the rank compares with what it had when it joined the pool; what
it can release it releases (meshes, subgroups), what it cannot (CUDA memory still referenced)
it reports, and the driver then replaces the pool before the next test.
"""

from __future__ import annotations

import gc
import sys
from typing import NamedTuple


class Baseline(NamedTuple):
    groups: frozenset[str]  # the process groups the pool itself made
    cuda_bytes: int


def _group_names() -> dict[str, object]:
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    # torch lists live groups only privately; on a torch without the list, none is cleaned up.
    names = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_names", None) or {}
    return {name: pg for pg, name in names.items()}


def _cuda_bytes() -> int:
    import torch

    if not torch.cuda.is_initialized():  # never initialise CUDA just to look
        return 0
    return sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))


def baseline() -> Baseline:
    """What a rank holds once it has joined its pool, before any test."""
    return Baseline(frozenset(_group_names()), _cuda_bytes())


def clean_up(start: Baseline) -> tuple[str, ...]:
    """Release what the task left behind; return what could not be released."""
    import torch
    import torch.distributed as dist

    released = False
    refddp_dist = sys.modules.get("refddp.dist")
    if refddp_dist is not None:
        released = refddp_dist.release_meshes()
    mesh_env = getattr(sys.modules.get("torch.distributed.device_mesh"), "_mesh_resources", None)
    if mesh_env is not None and mesh_env.mesh_stack:
        mesh_env.mesh_stack.clear()
        released = True
    unclean = []
    for name, group in sorted(_group_names().items()):
        if name in start.groups:
            continue
        released = True
        try:
            dist.destroy_process_group(group)
        except Exception as exc:  # noqa: BLE001 - reported: the driver replaces the pool
            unclean.append(f"process group {name} ({type(exc).__name__}: {exc})")
    if released or torch.cuda.is_initialized():
        gc.collect()  # a model's reference cycles may hold groups and CUDA memory
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        leaked = _cuda_bytes() - start.cuda_bytes
        if leaked > 0:
            unclean.append(f"{leaked} bytes of CUDA memory still allocated")
    return tuple(unclean)
