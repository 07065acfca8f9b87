"""The types that the driver, the ranks and test code share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from refddp.launch.dist import DistContext

__all__ = [
    "DistContext",
    "RankContext",
    "RankFailure",
    "RankSkipped",
    "RankTimeout",
    "rank_context",
]


@dataclass(frozen=True)
class RankContext(DistContext):
    """A harness rank's ``DistContext`` (the ``dist_ctx`` fixture), with its simulated node.

    Without nodes the rank is on node 0 of 1 and ``node_tmp_path`` is None.
    """

    node_rank: int = 0
    local_world_size: int = 1
    node_tmp_path: Path | None = None


_current: RankContext | None = None  # set by the worker while a task runs
# Set by the worker once it joined its pool: joins the pool's group again, after a test set it
# aside to start another backend for real (unittest_case.py).
_rejoin_pool_group: Callable[[], None] | None = None


def rank_context() -> RankContext | None:
    """Inside a harness task (a ``spawn`` function, a rank-side test): this rank's context, the
    one ``dist_ctx`` gives; None elsewhere."""
    return _current


class RankFailure(AssertionError):
    """One or more ranks raised, exited or were killed.

    ``failures`` maps rank -> the text explaining that rank's failure (remote traceback, or
    exit code / signal); ``cause`` is the rank that failed first (what the others then waited
    on), or None when no one rank is to blame (ranks that disagreed on a collective, say);
    ``str()`` also carries each rank's captured output tail.
    """

    def __init__(self, message: str, failures: dict[int, str], cause: int | None = None):
        super().__init__(message)
        self.failures = dict(failures)
        self.cause = cause


class RankTimeout(RankFailure):
    """The deadline passed; ``failures`` maps each unfinished rank to its stack at that moment."""


class RankSkipped(Exception):
    """A rank asked to skip the task (``pytest.skip`` inside it); the plugin turns it back into
    a skip, so the driver side needs no pytest."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
