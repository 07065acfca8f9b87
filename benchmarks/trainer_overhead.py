"""refddp.train against a minimal hand-written DDP loop doing the same work, 2 gloo ranks.

    python benchmarks/trainer_overhead.py [REPEATS]

Same model, data, global batch, optimizer, one epoch, one evaluation, one checkpoint. Both go
through the elastic agent. Goal (issue 7): refddp >= 0.97x the plain loop's speed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plain_ddp_loop import CONFIG  # noqa: E402
from record import write  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def timed(cmd: list[str]) -> float:
    begin = time.perf_counter()
    subprocess.run(
        cmd,
        check=True,
        env=ENV,
        cwd=os.path.dirname(HERE),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - begin


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]
    plain, ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):  # interleaved, so drift in machine load hits both alike
            plain.append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        "--standalone",
                        "--nproc-per-node",
                        "2",
                        os.path.join(HERE, "plain_ddp_loop.py"),
                        os.path.join(tmp, f"plain{i}"),
                    ]
                )
            )
            ours.append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "refddp.train",
                        "--nproc",
                        "2",
                        "--no-progress",
                        "--resume",
                        "never",
                        "--out",
                        os.path.join(tmp, f"refddp{i}"),
                        *flags,
                    ]
                )
            )
    result = {
        "plain_median_s": statistics.median(plain),
        "refddp_median_s": statistics.median(ours),
        "plain_all_s": plain,
        "refddp_all_s": ours,
        "speed_ratio": statistics.median(plain) / statistics.median(ours),
    }
    table = (
        f"plain DDP loop   {result['plain_median_s']:.2f} s (median of {repeats})\n"
        f"refddp.train     {result['refddp_median_s']:.2f} s\n"
        f"refddp speed     {result['speed_ratio']:.3f}x the plain loop (goal >= 0.97x)"
    )
    write("trainer_overhead", result, table)


if __name__ == "__main__":
    main()
