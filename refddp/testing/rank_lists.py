"""Rank lists a person can read at any world size: ``[0-16, 18-1023]``, and lines grouped by rank.

A failure among a thousand ranks is usually one cause and a thousand victims saying the same
thing; reports name each distinct thing once, with the ranks that share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_RANK_LINE = re.compile(r"rank (\d+): (.*)", re.DOTALL)


def rank_list(ranks: Iterable[int]) -> str:
    """``[0, 1, 3]``; runs of three or more consecutive ranks as ``first-last``: ``[0-16, 18]``."""
    ordered = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts += [str(r) for r in ordered[i : j + 1]]
        i = j + 1
    return "[" + ", ".join(parts) + "]"


def parse_rank_list(text: str) -> list[int]:
    """The ranks of a ``rank_list`` text (``"[0-2, 5]"`` -> ``[0, 1, 2, 5]``)."""
    ranks: list[int] = []
    for part in filter(str.strip, text.strip().strip("[]").split(",")):
        first, _, last = part.strip().partition("-")
        ranks += range(int(first), int(last or first) + 1)
    return ranks


def who(ranks: list[int]) -> str:
    """``rank 3`` for one rank; ``ranks [0-16, 18-1023] (1,023)`` for several."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {rank_list(ranks)} ({len(ranks):,})"


def group(keyed: Iterable[tuple[int, str]]) -> list[tuple[list[int], str]]:
    """(rank, text) pairs as (ranks, text) groups of equal text, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for rank, text in keyed:
        groups.setdefault(text, []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def group_rank_lines(lines: Iterable[str]) -> list[str]:
    """Lines ``rank N: what`` that say the same ``what`` merged into ``ranks [...] (n): what``;
    other lines kept, in order."""
    out: list[str | list] = []
    slots: dict[str, list] = {}
    for line in lines:
        match = _RANK_LINE.fullmatch(line)
        if match is None:
            out.append(line)
            continue
        rank, what = int(match[1]), match[2]
        if what not in slots:
            slots[what] = [what, []]
            out.append(slots[what])
        slots[what][1].append(rank)
    return [item if isinstance(item, str) else f"{who(item[1])}: {item[0]}" for item in out]
