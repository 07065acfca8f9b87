"""The harness at the world sizes users deploy: pool start, a warm test and memory, 8 to 1,024 ranks.

    python benchmarks/harness_scale.py [--sizes 8 64 256 1024] [--warm-calls 5] [--check-cost N]

For each size, on this machine (real processes, real gloo collectives): ``RankPool(n)``'s start
(ranks forked from the rank server and joined in one group; the server's own start is timed
apart), the first test (gloo connects each pair of ranks on its first message), then the median
of ``--warm-calls`` warm tests doing one ``all_reduce`` and one ``barrier``, interleaved with a
test that does nothing (the harness's own cost per test), both with the default fingerprint
check of every collective (``--no-fingerprint-check``: without); memory: the pool's ranks' summed PSS (shared pages split between
the processes that share them) and the drop in the machine's MemAvailable. A planted failure
at the largest size (rank 17 raises while the others wait in an all_reduce) records how many
lines the report takes. The goals (issue 41): 1,024 ranks start in <= 60 s, a warm test takes
<= 2 s, the pool stays under ~16 GiB.
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

from refddp.testing import RankFailure  # noqa: E402
from refddp.testing.driver import rank_server
from refddp.testing.driver.pool import RankPool  # noqa: E402


def nothing() -> None:
    """A test that does nothing: what remains is the harness's own cost per test."""


def all_reduce_and_barrier() -> None:
    dist.all_reduce(torch.ones(1))
    dist.barrier()


def switch_check(on: bool) -> None:
    """On every rank: the fingerprint check on or off for the collectives that follow (the pool
    started with it; its helper group is kept aside while it is off). refddp's own internals:
    a benchmark of refddp, not an API."""
    from refddp.testing.checks import collectives

    kept = collectives.__dict__.setdefault("_checker_kept", collectives._checker)
    collectives._checker = kept if on else None


def rank_17_fails() -> None:
    if dist.get_rank() == 17:
        raise ValueError("planted on rank 17")
    dist.all_reduce(torch.ones(1))


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            total += sum(int(ln.split()[1]) for ln in f if ln.startswith("Pss:"))
    return total / 1024


def available_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:")) / 1024


def check_cost(pool: RankPool, rotations: int) -> dict:
    """Warm tests with the check off and on in the same pool, interleaved: each timed after an
    untimed one in the same state."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rotations):
        for on in (False, True):
            pool.run(switch_check, (on,), timeout_s=600)
            pool.run(all_reduce_and_barrier, timeout_s=600)
            begin = time.perf_counter()
            pool.run(all_reduce_and_barrier, timeout_s=600)
            times[on].append(time.perf_counter() - begin)
    return {"same_pool_unchecked_s": times[False], "same_pool_checked_s": times[True],
            "same_pool_unchecked_median_s": statistics.median(times[False]),
            "same_pool_checked_median_s": statistics.median(times[True])}  # fmt: skip


def measure(world_size: int, warm_calls: int, plant: bool, check: bool = True,
            rotations: int = 0) -> dict:  # fmt: skip
    available = available_mib()
    begin = time.perf_counter()
    pool = RankPool(world_size, debug=check, start_timeout_s=600)
    start_s = time.perf_counter() - begin
    row: dict = {"world_size": world_size}
    try:
        begin = time.perf_counter()
        pool.run(all_reduce_and_barrier, timeout_s=600)
        first_s = time.perf_counter() - begin
        warm, idle = [], []
        for _ in range(warm_calls):
            begin = time.perf_counter()
            pool.run(all_reduce_and_barrier, timeout_s=600)
            warm.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            pool.run(nothing, timeout_s=600)
            idle.append(time.perf_counter() - begin)
        row |= {
            "fingerprint_check": check,
            "start_s": start_s,
            "first_test_s": first_s,
            "warm_test_median_s": statistics.median(warm),
            "warm_test_max_s": max(warm),
            "warm_noop_median_s": statistics.median(idle),
            "pss_gib": pss_mib([p.pid for p in pool.procs]) / 1024,
            "available_drop_gib": (available - available_mib()) / 1024,
        }
        if rotations and check:
            row |= check_cost(pool, rotations)
        if plant:
            begin = time.perf_counter()
            try:
                pool.run(rank_17_fails, timeout_s=600)
            except RankFailure as exc:
                row["planted_failure_s"] = time.perf_counter() - begin
                row["planted_failure_report_lines"] = len(str(exc).splitlines())
                row["planted_failure_headline"] = str(exc).splitlines()[:2]
    finally:
        begin = time.perf_counter()
        pool.close()
        row["close_s"] = time.perf_counter() - begin
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--warm-calls", type=int, default=5)
    parser.add_argument("--no-fingerprint-check", action="store_true",
                        help="ranks without the collective fingerprint check (--no-dist-debug)")
    parser.add_argument("--check-cost", type=int, default=0, metavar="ROTATIONS",
                        help="at the largest size, also time warm tests with the check off and "
                        "on in the same pool, ROTATIONS times each, interleaved")
    parser.add_argument("--name", default="harness_scale", help="results/NAME.json")
    args = parser.parse_args()
    for flag, value, least in (("--sizes", min(args.sizes), 1), ("--warm-calls", args.warm_calls, 1),
                               ("--check-cost", args.check_cost, 0)):  # fmt: skip
        if value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    load_before = os.getloadavg()
    begin = time.perf_counter()
    rank_server.server()
    server_s = time.perf_counter() - begin
    rows = []
    for size in args.sizes:
        plant = size == max(args.sizes) and size > 17
        rotations = args.check_cost if size == max(args.sizes) else 0
        rows.append(measure(size, args.warm_calls, plant, not args.no_fingerprint_check, rotations))
        print(rows[-1], flush=True)
    rank_server.shutdown_server()
    table = "\n".join(
        [f"{'ranks':>6} {'start':>8} {'first test':>11} {'warm test':>10} {'warm no-op':>11} "
         f"{'PSS':>9} {'avail. drop':>12} {'close':>7}"]
        + [
            f"{r['world_size']:>6} {r['start_s']:>6.1f} s {r['first_test_s']:>9.2f} s "
            f"{r['warm_test_median_s']:>8.3f} s {r['warm_noop_median_s']:>9.3f} s "
            f"{r['pss_gib']:>5.1f} GiB {r['available_drop_gib']:>8.1f} GiB {r['close_s']:>5.1f} s"
            for r in rows
        ]
        + [
            f"rank server start (once per session): {server_s:.2f} s",
            *(f"planted failure at {r['world_size']} ranks: reported in "
              f"{r['planted_failure_s']:.1f} s, {r['planted_failure_report_lines']} lines"
              for r in rows if "planted_failure_s" in r),
            *(f"{r['world_size']} ranks, one pool, check off / on in rotation: warm test "
              f"{r['same_pool_unchecked_median_s']:.3f} s / {r['same_pool_checked_median_s']:.3f} s "
              f"(medians of {len(r['same_pool_checked_s'])})"
              for r in rows if "same_pool_checked_s" in r),
            f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}",
        ]
    )  # fmt: skip
    write(args.name, rows, table, load_before[0])


if __name__ == "__main__":
    main()
