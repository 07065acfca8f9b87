"""Weak scaling on CPU: 1 -> 2 gloo ranks, one thread each, the same per-rank batch.

    python benchmarks/weak_scaling.py [REPEATS]

Swept over the per-rank batch. On a 2-core machine the two ranks' compute fills both cores,
so the gradient all-reduce (8.4 MB per step for this 2.1M-parameter MLP, copied through
loopback TCP) cannot hide behind backward; and two processes share the cores' caches and
memory bandwidth even with no communication at all. The last column measures that ceiling:
two independent 1-rank jobs side by side. Throughput is each run's second history window
(no start-up). Goal (issue 7): >= 1.85x.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

STEPS = 40
MODEL = ["--hidden-size", "1024", "--depth", "3"]


def start(nproc: int, batch: int, out: str) -> subprocess.Popen:
    flags = [*MODEL, "--batch-size", str(batch), "--train-size", str(2 * batch * STEPS),
             "--epochs", "1", "--max-steps", str(STEPS), "--eval-every", str(STEPS // 2),
             "--val-size", "256", "--no-progress", "--resume", "never"]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "refddp.train", "--nproc", str(nproc), "--out", out, *flags],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def result(proc: subprocess.Popen, out: str) -> dict:
    assert proc.wait() == 0, f"run in {out} failed"
    with open(os.path.join(out, "history.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    return {"samples_per_s": last["samples_per_s"], "step_ms": last["step_time_s"] * 1e3}


def run(nproc: int, batch: int, out: str) -> dict:
    return result(start(nproc, batch, out), out)


def two_independent_jobs(batch: int, out: str) -> float:
    """The machine's ceiling: two 1-rank jobs side by side, no communication at all."""
    procs = [(start(1, batch, f"{out}-{i}"), f"{out}-{i}") for i in range(2)]
    return sum(result(p, o)["samples_per_s"] for p, o in procs)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (128, 512, 2048):
            runs: dict[int, list[dict]] = {1: [], 2: []}
            pairs = []
            for i in range(repeats):
                for nproc in (1, 2):
                    runs[nproc].append(run(nproc, batch, os.path.join(tmp, f"{batch}-{nproc}-{i}")))
                pairs.append(two_independent_jobs(batch, os.path.join(tmp, f"{batch}-pair-{i}")))
            one = statistics.median(r["samples_per_s"] for r in runs[1])
            two = statistics.median(r["samples_per_s"] for r in runs[2])
            ceiling = statistics.median(pairs)
            rows.append({
                "per_rank_batch": batch, "samples_per_s_1": one, "samples_per_s_2": two,
                "step_ms_1": statistics.median(r["step_ms"] for r in runs[1]),
                "step_ms_2": statistics.median(r["step_ms"] for r in runs[2]),
                "speedup": two / one, "two_independent_jobs_speedup": ceiling / one,
            })  # fmt: skip
    header = (f"{'batch/rank':>10} {'1 rank':>11} {'2 ranks':>11} {'step 1r':>9} {'step 2r':>9} "
              f"{'speed-up':>9} {'ceiling: 2 jobs, no comm':>25}")  # fmt: skip
    lines = [header] + [
        f"{r['per_rank_batch']:>10} {r['samples_per_s_1']:>9.0f}/s {r['samples_per_s_2']:>9.0f}/s "
        f"{r['step_ms_1']:>7.1f}ms {r['step_ms_2']:>7.1f}ms {r['speedup']:>8.2f}x "
        f"{r['two_independent_jobs_speedup']:>24.2f}x"
        for r in rows
    ]
    write("weak_scaling", rows, "\n".join(lines) + "\n(goal >= 1.85x)")


if __name__ == "__main__":
    main()
