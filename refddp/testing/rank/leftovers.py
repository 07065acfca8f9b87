"""What a test leaves behind on a warm rank, found and cleaned after each task.

A pool's ranks live from test to test, so state a test builds and does not tear down would
reach the next one: device meshes (refddp's ``device_mesh`` list and torch's mesh stack),
process groups from ``dist.new_group`` (each holds sockets and threads), CUDA memory still
allocated. After each task the rank compares with what it had when it joined the pool; what
it can release it releases (meshes, subgroups: a gloo group is freed just after the task's
reply, ``free_destroyed``), what it cannot (CUDA memory still referenced) it reports, and the
driver then replaces the pool before the next test.

Before each task the rank also gives it a store namespace of its own (``fresh_namespace``):
the store the pool's ranks share outlives every test, and a group a test creates can bear the
name of an earlier test's (``new_group(use_local_synchronization=True)`` names a group after
its ranks), whose rendezvous keys would otherwise still be there to read.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any, NamedTuple


class Baseline(NamedTuple):
    groups: frozenset[str]  # the process groups the pool itself made
    cuda_bytes: int


_shared_store: object = None  # the default group's store as the pool made it
_tasks = 0  # tasks this rank has started: every rank of a pool runs every task, in order
# The gloo groups the last clean-up destroyed, held until ``free_destroyed`` lets them go,
# after the task's reply. Why: a gloo group's worker thread may still be releasing the task's last
# collective (its tensors: it takes the GIL for that) when the task returns, and a torch
# without pytorch/pytorch#154976 (2.5 here; merged June 2025) joins those threads in the
# group's destructor holding the GIL: freed inside the clean-up, the group could deadlock
# its rank (seen on 2.5 in 6 of 12 runs of a test whose last call was an all-reduce on its
# own group). Freed soon all the same: freeing closes the group's connections, and a peer
# still waiting in a collective this rank never joined then fails at once.
_destroyed: list[object] = []
RELEASE_PAUSE_S = 0.1  # the GIL left to the groups' threads before the groups are freed


def fresh_namespace() -> None:
    """Point the default group's store, which ``new_group`` creates groups from, at a prefix
    of the pool's store that no earlier task used (the same on every rank of the pool)."""
    global _shared_store, _tasks
    import torch.distributed as dist

    # torch keeps each group's store in a private map and has no public way to set it; on a
    # torch without the map, tests share the pool's namespace.
    stores = _torch_world("pg_map")
    default = dist.group.WORLD if dist.is_initialized() else None
    if stores is None or default not in stores:
        return
    backend, store = stores[default]
    if _shared_store is None:
        _shared_store = store
    _tasks += 1
    stores[default] = (backend, dist.PrefixStore(f"refddp-task{_tasks}/", _shared_store))


def _group_names() -> dict[str, object]:
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    # torch lists live groups only privately; on a torch without the list, none is cleaned up.
    names = _torch_world("pg_names") or {}
    return {name: pg for pg, name in names.items()}


def _torch_world(name: str) -> Any:
    """``name`` of torch's private registry of process groups, or None where torch has none."""
    import torch.distributed as dist

    return getattr(getattr(dist.distributed_c10d, "_world", None), name, None)


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
    refddp_dist = sys.modules.get("refddp.launch.dist")
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
            gloo = dist.get_backend(group) == "gloo"
            dist.destroy_process_group(group)
        except Exception as exc:  # noqa: BLE001 - reported: the driver replaces the pool
            unclean.append(f"process group {name} ({type(exc).__name__}: {exc})")
            continue
        if gloo:  # freed after the reply (``_destroyed``); others here, before the CUDA count
            _destroyed.append(group)
    if released or torch.cuda.is_initialized():
        gc.collect()  # a model's reference cycles may hold groups and CUDA memory
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        leaked = _cuda_bytes() - start.cuda_bytes
        if leaked > 0:
            unclean.append(f"{leaked} bytes of CUDA memory still allocated")
    return tuple(unclean)


def free_destroyed() -> None:
    """Free the groups the last clean-up destroyed, once their threads have had the GIL for
    a moment (``_destroyed``). The rank calls it after sending the task's reply."""
    if _destroyed:
        time.sleep(RELEASE_PAUSE_S)
        _destroyed.clear()
