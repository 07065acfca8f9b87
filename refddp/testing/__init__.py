"""Run test code on N-process ``torch.distributed`` groups.

Installed as a pytest plugin (``pytest11`` entry point): the ``spawn`` and ``dist_ctx`` fixtures
and the ``multiproc``, ``world_size``, ``nodes``, ``faults`` and ``gpu`` markers need no import.
Outside pytest::

    from refddp.testing import faults
    from refddp.testing import spawn_ranks
    results = spawn_ranks(fn, 3, world_size=4)   # one result per rank, ordered by rank
    spawn_ranks(fn, world_size=4, nnodes=2, faults=[faults.kill(1, at=3)])

``Cluster(n)`` makes n real nodes on one Linux machine (network namespaces; root, or a user
namespace of its own) for tests of
multi-node jobs: ``refddp/testing/cluster.py``.
"""

from typing import TYPE_CHECKING, Any

__all__ = [
    "Cluster",
    "DistContext",
    "DistributedTestCase",
    "RankContext",
    "RankFailure",
    "RankSkipped",
    "RankTimeout",
    "assert_matches_single_process",
    "assert_replicas_equal",
    "fault_point",
    "faults",
    "rank_context",
    "record_collectives",
    "shutdown_pools",
    "spawn_ranks",
]

if TYPE_CHECKING:
    from refddp.testing import faults
    from refddp.testing.checks.collectives import record_collectives
    from refddp.testing.cluster import Cluster
    from refddp.testing.context import (
        DistContext,
        RankContext,
        RankFailure,
        RankSkipped,
        RankTimeout,
        rank_context,
    )
    from refddp.testing.driver.unittest_case import DistributedTestCase
    from refddp.testing.driver.warm_pools import shutdown_pools, spawn_ranks
    from refddp.testing.faults import fault_point
    from refddp.testing.rank.parity import assert_matches_single_process, assert_replicas_equal

_HOMES = {
    "Cluster": "cluster",
    "record_collectives": "checks.collectives",
    "DistContext": "context",
    "RankContext": "context",
    "RankFailure": "context",
    "RankSkipped": "context",
    "RankTimeout": "context",
    "rank_context": "context",
    "fault_point": "faults",
    "assert_matches_single_process": "rank.parity",
    "assert_replicas_equal": "rank.parity",
    "DistributedTestCase": "driver.unittest_case",
    "shutdown_pools": "driver.warm_pools",
    "spawn_ranks": "driver.warm_pools",
}


def __getattr__(name: str) -> Any:
    # Lazy: pytest loads the plugin (a submodule of this package) in every session of every
    # project that installs refddp; a session without distributed tests must not import torch.
    import importlib

    if name == "faults":
        return importlib.import_module("refddp.testing.faults")
    if name not in _HOMES:
        raise AttributeError(f"module 'refddp.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"refddp.testing.{_HOMES[name]}"), name)
