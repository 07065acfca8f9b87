"""What the collective check's waits cost: a checked send-and-receive round trip between two
ranks, and a checked all-reduce on a subgroup, in µs, on warm pools.

    python benchmarks/harness_waits.py [--rounds 5] [--calls 300] [--name harness_waits]

Both wait in the pool's store: a receive for its send's post (which the sender makes before it
sends), a subgroup's members for the group's rank 0 to compare their records. While waiting a
rank also reads its peers' slots, to name a peer that can never come
(``refddp/testing/checks/fingerprint.py``). Run against an older tree (PYTHONPATH=TREE) it
times that tree's check: the "before" of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

from refddp.testing.driver.warm_pools import shutdown_pools, spawn_ranks  # noqa: E402


def round_trips(calls: int) -> float:
    """µs per round trip: rank 0 sends and receives, rank 1 receives and sends back."""
    t, other = torch.ones(16), 1 - dist.get_rank()
    start = time.perf_counter()
    for _ in range(calls):
        if dist.get_rank() == 0:
            dist.send(t, other)
            dist.recv(t, other)
        else:
            dist.recv(t, other)
            dist.send(t, other)
    return (time.perf_counter() - start) / calls * 1e6


def subgroup_all_reduces(calls: int) -> float:
    """µs per all-reduce on the subgroup of ranks 0 and 2 (of 3)."""
    group, t = dist.new_group([0, 2]), torch.ones(16)
    start = time.perf_counter()
    if dist.get_rank() in (0, 2):
        for _ in range(calls):
            dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--name", default="harness_waits", help="results/NAME.json")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    cases = {"send and receive, round trip": (round_trips, 2),
             "all_reduce on a subgroup": (subgroup_all_reduces, 3)}  # fmt: skip
    results, rows = {}, []
    try:
        for label, (task, world_size) in cases.items():
            spawn_ranks(task, 10, world_size=world_size)  # the pool up, warm
            times = [spawn_ranks(task, args.calls, world_size=world_size)[0]
                     for _ in range(args.rounds)]  # fmt: skip
            results[label] = {"us": times, "median_us": statistics.median(times)}
            rows.append(f"{label:30} median {statistics.median(times):7.0f} µs "
                        f"({min(times):.0f}-{max(times):.0f}, {args.rounds} rounds)")  # fmt: skip
            print(rows[-1], flush=True)
    finally:
        shutdown_pools()
    write(args.name, results, "\n".join(rows), load_before)


if __name__ == "__main__":
    main()
