"""Share of step time spent waiting on data, with 0 and 2 DataLoader workers, one rank.

    python benchmarks/data_loading.py

Two datasets: the built-in synthetic one (batched tensor indexing: nearly free) and a
per-sample one with some CPU work per item (decode/augment stand-in), where workers matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

FLAGS = [
    "--hidden-size",
    "512",
    "--depth",
    "3",
    "--batch-size",
    "128",
    "--train-size",
    "16384",
    "--val-size",
    "512",
    "--epochs",
    "1",
    "--no-progress",
    "--resume",
    "never",
    "--nproc",
    "1",
]


def measure(data: str, workers: int, out: str) -> dict:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "refddp.train",
            "--out",
            out,
            "--data",
            data,
            "--num-workers",
            str(workers),
            *FLAGS,
        ],
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(os.path.join(out, "history.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    return {"data_wait_share": last["data_wait_share"], "samples_per_s": last["samples_per_s"]}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for data in ("synthetic", "benchmarks.slow_data:per_sample_datasets"):
            for workers in (0, 2):
                r = measure(data, workers, os.path.join(tmp, f"{len(rows)}"))
                rows.append({"data": data, "num_workers": workers, **r})
    table = "\n".join(
        [f"{'data':<42} {'workers':>7} {'waiting':>8} {'samples/s':>10}"]
        + [
            f"{r['data']:<42} {r['num_workers']:>7} {r['data_wait_share']:>7.1%} {r['samples_per_s']:>10.0f}"
            for r in rows
        ]
    )
    write("data_loading", rows, table)


if __name__ == "__main__":
    main()
