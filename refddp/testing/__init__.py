"""Run test code on N-process ``torch.distributed`` groups.

Installed as a pytest plugin (``pytest11`` entry point): the ``spawn`` and ``dist_ctx`` fixtures
and the ``multiproc``, ``world_size`` and ``gpu`` markers need no import. Outside pytest::

    from refddp.testing import spawn_ranks
    results = spawn_ranks(fn, 3, world_size=4)   # one result per rank, ordered by rank
"""

from typing import TYPE_CHECKING, Any

__all__ = [
    "DistContext",
    "RankFailure",
    "RankSkipped",
    "RankTimeout",
    "record_collectives",
    "shutdown_pools",
    "spawn_ranks",
]

if TYPE_CHECKING:
    from refddp.testing.collectives import record_collectives
    from refddp.testing.context import DistContext, RankFailure, RankSkipped, RankTimeout
    from refddp.testing.pool import shutdown_pools, spawn_ranks

_HOMES = {
    "record_collectives": "collectives",
    "DistContext": "context",
    "RankFailure": "context",
    "RankSkipped": "context",
    "RankTimeout": "context",
    "shutdown_pools": "pool",
    "spawn_ranks": "pool",
}


def __getattr__(name: str) -> Any:
    # Lazy: pytest loads the plugin (a submodule of this package) in every session of every
    # project that installs refddp; a session without distributed tests must not import torch.
    if name not in _HOMES:
        raise AttributeError(f"module 'refddp.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"refddp.testing.{_HOMES[name]}"), name)
