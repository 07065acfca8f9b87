"""Run test code on N-process ``torch.distributed`` groups.

Installed as a pytest plugin (``pytest11`` entry point): the ``spawn`` and ``dist_ctx`` fixtures
and the ``multiproc``, ``world_size`` and ``gpu`` markers need no import. Outside pytest::

    from refddp.testing import spawn_ranks
    results = spawn_ranks(fn, 3, world_size=4)   # one result per rank, ordered by rank
"""

from refddp.testing.collectives import record_collectives
from refddp.testing.context import DistContext, RankFailure, RankSkipped, RankTimeout
from refddp.testing.pool import shutdown_pools, spawn_ranks

__all__ = [
    "DistContext",
    "RankFailure",
    "RankSkipped",
    "RankTimeout",
    "record_collectives",
    "shutdown_pools",
    "spawn_ranks",
]
