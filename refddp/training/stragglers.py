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
per step its compute and data wait exceed the median of the other ranks'),
``straggler_lag_share`` (that lag over the same median) and ``behind_ranks`` (every rank at
least ``LAG_SHARE`` slower than the median of the others: a slow node's ranks together). The
log warns, naming the ranks behind, and their node when they are all of one node's, when the
same rank (on a job of several nodes, the same node) is the slowest at ``PERSISTENT``
evaluations in a row, each time by at least ``LAG_SHARE`` (10% over the median of the
others): a single slow window (a checkpoint write, a busy neighbour) is noise, the same rank
or node behind again and again is a straggler.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch

from refddp.training.window import Window

LAG_SHARE = 0.10  # the slowest rank's lag over the median of the others, for a warning
PERSISTENT = 3  # evaluations in a row with the same slowest rank (or node) above LAG_SHARE


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
    # Every rank measured against the same median of the others: a slow node holding half the
    # ranks (2 nodes) leaves one of its ranks fewer than the fast half among them, so the
    # median is a fast rank's, not one halfway between; and the slowest rank is behind exactly
    # when its lag share is over the bar.
    bar = others * (1 + LAG_SHARE)
    return {
        "slowest_rank": slowest,
        "straggler_lag_s": lag,
        "straggler_lag_share": lag / others if others > 0 else 0.0,
        "behind_ranks": [r for r in range(world) if busy[r] > bar] if others > 0 else [],
    }


def whose(ranks: list[int], ranks_per_node: int) -> str:
    """``rank 3``, ``ranks [2, 3]``, with ``(node 1)`` when they are every rank of one node
    (``(nodes 1, 2)`` of several) on a job of several nodes of ``ranks_per_node`` ranks."""
    said = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
    if ranks_per_node < 1 or len(ranks) % ranks_per_node:
        return said
    nodes = sorted({r // ranks_per_node for r in ranks})
    if len(nodes) * ranks_per_node != len(ranks):
        return said
    return f"{said} ({'node' if len(nodes) == 1 else 'nodes'} {', '.join(map(str, nodes))})"


class StragglerWatch:
    """Says, once per streak, when the same rank (or node) stays the slowest (see the module's
    threshold).

    ``ranks_per_node``: on a job of several nodes of that many ranks each, the streak follows
    the slowest rank's node, and the ranks behind are named with their node when they are all
    of its ranks: a slow machine, not a slow rank. (Which of a slow node's ranks is the very
    slowest changes from one evaluation to the next; the node does not.)
    """

    def __init__(self, ranks_per_node: int = 0) -> None:
        self.key: int | None = None
        self.streak = 0
        self.ranks_per_node = ranks_per_node

    def observe(self, fields: dict[str, Any]) -> str | None:
        """The warning to log for this evaluation's straggler fields, if any."""
        if not fields or fields["straggler_lag_share"] < LAG_SHARE:
            self.key, self.streak = None, 0
            return None
        slowest = fields["slowest_rank"]
        key = slowest // self.ranks_per_node if self.ranks_per_node else slowest
        if key != self.key:
            self.key, self.streak = key, 0
        self.streak += 1
        if self.streak != PERSISTENT:
            return None
        behind = fields.get("behind_ranks") or [slowest]
        if len(behind) == 1:
            return (
                f"{whose(behind, self.ranks_per_node)} is the slowest at {PERSISTENT} "
                f"evaluations in a row: its compute and data wait take "
                f"{fields['straggler_lag_s'] * 1e3:.1f} ms per step "
                f"({fields['straggler_lag_share']:.0%}) more than the median of the other "
                "ranks; every rank waits for it at each step"
            )
        return (
            f"{whose(behind, self.ranks_per_node)} are the slowest at {PERSISTENT} evaluations "
            f"in a row: the slowest's compute and data wait take "
            f"{fields['straggler_lag_s'] * 1e3:.1f} ms per step "
            f"({fields['straggler_lag_share']:.0%}) more than the median of the other ranks; "
            "every rank waits for them at each step"
        )


def ranks_per_node(world_size: int) -> int:
    """Ranks per node on a job of several nodes of equal size (torchrun's ``LOCAL_WORLD_SIZE``
    and ``GROUP_WORLD_SIZE``, its node count); 0 for one node, another launcher (``srun``
    sets neither) or nodes of different sizes: ranks are then named without their node."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    except ValueError:
        return 0
    return local if nodes > 1 and local * nodes == world_size else 0
