"""Harness overhead: a trivial all_reduce through a warm `spawn_ranks` pool vs a fresh pool.

    python benchmarks/harness_overhead.py

The goal (issue 2): median warm overhead at world size 2 <= 20 ms. PyTorch's references on
these machines: MultiProcessTestCase ~3.2 s per test, MultiProcContinuousTest ~9 ms per test.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from record import write  # noqa: E402

from refddp.testing.pool import RankPool, shutdown_pools, spawn_ranks  # noqa: E402

WARM_CALLS, FRESH_STARTS = 200, 5


def trivial_all_reduce() -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def main() -> None:
    rows = []
    for world_size in (2, 4):
        starts = []
        for _ in range(FRESH_STARTS):  # what a fresh group per test costs: start + one call
            begin = time.perf_counter()
            pool = RankPool(world_size)
            pool.run(trivial_all_reduce, timeout_s=60)
            starts.append(time.perf_counter() - begin)
            pool.close()
        spawn_ranks(trivial_all_reduce, world_size=world_size)  # start the warm pool
        warm = []
        for _ in range(WARM_CALLS):
            begin = time.perf_counter()
            spawn_ranks(trivial_all_reduce, world_size=world_size)
            warm.append(time.perf_counter() - begin)
        shutdown_pools()
        rows.append(
            {
                "world_size": world_size,
                "warm_median_ms": statistics.median(warm) * 1e3,
                "warm_p90_ms": sorted(warm)[int(0.9 * len(warm))] * 1e3,
                "fresh_median_s": statistics.median(starts),
            }
        )
    table = "\n".join(
        [f"{'world size':>10} {'warm median':>12} {'warm p90':>10} {'fresh pool + call':>18}"]
        + [
            f"{r['world_size']:>10} {r['warm_median_ms']:>9.2f} ms {r['warm_p90_ms']:>7.2f} ms "
            f"{r['fresh_median_s']:>16.2f} s"
            for r in rows
        ]
    )
    write("harness_overhead", rows, table)


if __name__ == "__main__":
    main()
