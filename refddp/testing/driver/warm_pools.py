"""The warm pools, by key, and ``spawn_ranks``: which pool a task runs on.

A pool (``pool.py``) is started on the first task of its key and reused by every later one;
one that broke, lost a rank between tasks or was left unsound is replaced before the next
task. Every pool, and the rank server, stops at exit.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from refddp.config.validation import seconds_error
from refddp.testing.driver import rank_server
from refddp.testing.driver.pool import RankPool
from refddp.testing.driver.tasks import DEFAULT_TIMEOUT_S, _PoolGone
from refddp.testing.faults import Fault, check_node_faults
from refddp.testing.nodes import simulated as node_layout


class PoolKey(NamedTuple):
    """What makes two pools different: a task runs on the warm pool of its key."""

    world_size: int
    backend: str = "gloo"
    debug: bool = True
    devices: tuple[str, ...] = ()
    nnodes: int | None = None
    real_nodes: bool = False  # each node a cluster.Cluster's (nodes/simulated.py)


_pools: dict[PoolKey, RankPool] = {}


def get_pool(key: PoolKey) -> RankPool:
    """The warm pool for this key, started on first use, after the last one broke, or when a
    rank of it died between tasks."""
    pool = _pools.get(key)
    if pool is None or not pool.sound or not pool.alive():
        if pool is not None:
            pool.close()
        pool = _pools[key] = RankPool(
            key.world_size, key.backend, key.debug, key.devices, nnodes=key.nnodes,
            real_nodes=key.real_nodes,
        )  # fmt: skip
    return pool


def run_on_pool(
    key: PoolKey,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    timeout_s: float,
    **options: Any,
) -> list[Any]:
    """Run a task on the warm pool for ``key``; ``options`` as ``RankPool.run`` takes them.

    A pool found dead while the task was being sent is replaced and the task sent once more:
    nothing of it had run.
    """
    __tracebackhide__ = True
    node_layout.layout(key.world_size, key.nnodes)  # a bad layout fails before any pool starts
    if seconds_error(timeout_s):  # so does a deadline the driver's wait cannot take
        raise ValueError(f"timeout: {seconds_error(timeout_s)}")
    check_node_faults(tuple(options.get("faults", ())), key.nnodes, key.real_nodes)  # so do these
    try:
        return get_pool(key).run(fn, args, kwargs, timeout_s, **options)
    except _PoolGone:
        return get_pool(key).run(fn, args, kwargs, timeout_s, **options)


def close_pool(key: PoolKey) -> None:
    """Stop the pool for this key, if one runs."""
    pool = _pools.pop(key, None)
    if pool is not None:
        pool.close()


def shutdown_pools() -> None:
    """Stop every pool this process started, then the rank server (also run at exit)."""
    while _pools:
        _, pool = _pools.popitem()
        pool.close()
    rank_server.shutdown_server()


atexit.register(shutdown_pools)


def spawn_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    backend: str | None = None,
    timeout: float | None = None,
    debug: bool = True,
    faults: Iterable[Fault] = (),
    nnodes: int | None = None,
    real_nodes: bool = False,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on every rank of a ``world_size`` group; one result per rank.

    ``backend=None`` means gloo (the pytest ``spawn`` fixture picks nccl for ``gpu`` tests);
    ``faults`` are injected (``refddp.testing.faults``); ``nnodes`` splits the ranks into
    simulated nodes (``nodes/simulated.py``), real ones (network namespaces, root only) with
    ``real_nodes``. Raises ``RankFailure`` as soon as a rank fails (``cause``:
    the rank that failed first), ``RankTimeout`` after ``timeout`` seconds (or sooner for a
    certain hang) and ``RankSkipped`` if a rank skipped.
    """
    __tracebackhide__ = True
    key = PoolKey(world_size, backend or "gloo", debug, (), nnodes, real_nodes)
    deadline = timeout if timeout is not None else DEFAULT_TIMEOUT_S
    return run_on_pool(key, fn, args, kwargs, deadline, faults=tuple(faults))
