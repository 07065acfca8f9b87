"""Which rank holds the others back: each rank's compute and data wait, compared at evaluations.

Every step waits for the slowest rank (the gradient all-reduce), so a rank's step time says
nothing of who is slow. Each rank measures its own share instead (``Window``): the time it
waits for data, and the time it computes (``Trainer.train_step``): its forwards and the
backwards that only accumulate (``no_sync``); the backward that all-reduces the gradients ends
waiting for the slowest rank, so with several ranks it is left out (one process times it). A
rank slow only in that backward is therefore not told apart (docs/known-limitations.md). At
an evaluation these ride the all-reduce of the training loss the evaluation makes anyway
(``times_vector``): rank r fills slots r and world + r with its seconds, every other rank
zeros, so the sum holds every rank's. No collective of its own, none per step.

History then records (world size > 1) ``slowest_rank``, ``straggler_lag_s`` (how many seconds
per step its compute and data wait exceed the median of the other ranks') and
``straggler_lag_share`` (that lag over the same median). The log warns, naming the rank,
when one rank is the slowest at ``PERSISTENT`` evaluations in a row, each time by at least
``LAG_SHARE`` (10% over the median of the others): a single slow window (a checkpoint write,
a busy neighbour) is noise, the same rank behind again and again is a straggler.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from refddp.window import Window

LAG_SHARE = 0.10  # the slowest rank's lag over the median of the others, for a warning
PERSISTENT = 3  # evaluations in a row with the same slowest rank above LAG_SHARE


def times_vector(window: Window, rank: int, world: int, device: torch.device) -> torch.Tensor:
    """This rank's [compute, data wait] per step, in its own slots of a zero vector of
    ``2 * world``: summed over ranks, every rank's."""
    compute, data_wait, steps = window.rank_times()
    per_step = 1.0 / max(steps, 1)
    vector = torch.zeros(2 * world, dtype=torch.float64, device=device)
    vector[rank], vector[world + rank] = compute * per_step, data_wait * per_step
    return vector


def straggler_fields(summed: list[float]) -> dict[str, Any]:
    """A history record's straggler fields from the summed ``times_vector`` ({} for one
    rank)."""
    world = len(summed) // 2
    if world < 2:
        return {}
    busy = [summed[r] + summed[world + r] for r in range(world)]  # seconds per step
    slowest = max(range(world), key=lambda r: busy[r])
    others = statistics.median(b for r, b in enumerate(busy) if r != slowest)
    lag = busy[slowest] - others
    return {
        "slowest_rank": slowest,
        "straggler_lag_s": lag,
        "straggler_lag_share": lag / others if others > 0 else 0.0,
    }


class StragglerWatch:
    """Says, once per streak, when one rank stays the slowest (see the module's threshold)."""

    def __init__(self) -> None:
        self.rank: int | None = None
        self.streak = 0

    def observe(self, fields: dict[str, Any]) -> str | None:
        """The warning to log for this evaluation's straggler fields, if any."""
        if not fields or fields["straggler_lag_share"] < LAG_SHARE:
            self.rank, self.streak = None, 0
            return None
        if fields["slowest_rank"] != self.rank:
            self.rank, self.streak = fields["slowest_rank"], 0
        self.streak += 1
        if self.streak != PERSISTENT:
            return None
        return (
            f"rank {self.rank} is the slowest at {PERSISTENT} evaluations in a row: its compute "
            f"and data wait take {fields['straggler_lag_s'] * 1e3:.1f} ms per step "
            f"({fields['straggler_lag_share']:.0%}) more than the median of the other ranks; "
            "every rank waits for it at each step"
        )
