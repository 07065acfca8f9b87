"""Harness overhead: a fresh pool's start and a warm pool's per-test cost, at world sizes 2-16.

    python benchmarks/harness_overhead.py [--sizes 2 4 8 16] [--fresh-starts 5] [--warm-calls 200]

A fresh pool: ``RankPool(n)`` plus one call of a trivial all-reduce, ranks forked from the rank
server (started once per session, timed apart); a warm call: ``spawn_ranks`` on a pool that is
already up, of a function that does nothing (the harness's own cost per test) and, interleaved,
of the trivial all-reduce (plus one fingerprint-checked collective). The goals (issue 22): 8 ranks ready in <= 2 s on the 2-core machine,
warm overhead <= 5 ms per test at 8 ranks. Run against an older tree (PYTHONPATH=...) it times
that tree's pools, whose ranks were fresh interpreters: the "before" of the README.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from record import write  # noqa: E402

try:
    from refddp.testing.driver import rank_server
    from refddp.testing.driver.pool import RankPool
    from refddp.testing.driver.warm_pools import shutdown_pools, spawn_ranks
except ImportError:  # an older tree: refddp/testing/ before its folders
    from refddp.testing.pool import RankPool  # type: ignore[no-redef]

    try:
        from refddp.testing.warm_pools import shutdown_pools, spawn_ranks  # type: ignore[no-redef]

        from refddp.testing import rank_server  # type: ignore[no-redef]
    except ImportError:  # a tree from before the rank server
        rank_server = None
        from refddp.testing.pool import shutdown_pools, spawn_ranks  # type: ignore[no-redef]


def nothing() -> None:
    """A test that does nothing: what remains is the harness's own cost per test."""


def trivial_all_reduce() -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--fresh-starts", type=int, default=5)
    parser.add_argument("--warm-calls", type=int, default=200)
    parser.add_argument("--name", default="harness_overhead", help="results/NAME.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    server_start_s = None
    if rank_server is not None:
        begin = time.perf_counter()
        rank_server.server()
        server_start_s = time.perf_counter() - begin
    rows = []
    for world_size in args.sizes:
        starts = []
        for _ in range(args.fresh_starts):  # what a fresh group per test costs: start + one call
            begin = time.perf_counter()
            pool = RankPool(world_size)
            pool.run(trivial_all_reduce, timeout_s=120)
            starts.append(time.perf_counter() - begin)
            pool.close()
        spawn_ranks(trivial_all_reduce, world_size=world_size, timeout=120)  # the warm pool
        warm, idle = [], []
        for _ in range(args.warm_calls):  # interleaved: both see the machine alike
            begin = time.perf_counter()
            spawn_ranks(trivial_all_reduce, world_size=world_size)
            warm.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            spawn_ranks(nothing, world_size=world_size)
            idle.append(time.perf_counter() - begin)
        shutdown_pools()
        rows.append(
            {
                "world_size": world_size,
                "warm_noop_median_ms": statistics.median(idle) * 1e3,
                "warm_median_ms": statistics.median(warm) * 1e3,
                "warm_p90_ms": sorted(warm)[int(0.9 * len(warm))] * 1e3,
                "fresh_median_s": statistics.median(starts),
                "fresh_max_s": max(starts),
            }
        )
    for row in rows:
        row["server_start_s"] = server_start_s
    table = "\n".join(
        [
            f"{'world size':>10} {'warm no-op':>11} {'warm all_reduce':>16} {'p90':>9} "
            f"{'fresh pool + call':>18}"
        ]
        + [
            f"{r['world_size']:>10} {r['warm_noop_median_ms']:>8.2f} ms "
            f"{r['warm_median_ms']:>13.2f} ms {r['warm_p90_ms']:>6.2f} ms "
            f"{r['fresh_median_s']:>16.2f} s"
            for r in rows
        ]
        + [
            "rank server start (once per session): "
            + (f"{server_start_s:.2f} s" if server_start_s is not None else "none (no server)"),
            f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}",
        ]
    )
    write(args.name, rows, table, load_before[0])


if __name__ == "__main__":
    main()
