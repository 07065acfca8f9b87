"""Write a benchmark's results with the machine, torch version and the command that made them."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

import torch

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict[str, Any]:
    info = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(
                ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return info


def commit() -> str | None:
    """The checked-out commit, with ``+`` when tracked files outside the results differ from it
    (results a run has just written do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=RESULTS, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ":/",
                      ":(top,exclude)benchmarks/results")  # fmt: skip
        return git("rev-parse", "--short", "HEAD") + ("+" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def allocator_env(env: dict[str, str]) -> dict[str, str]:
    """The C allocator's settings in ``env`` (glibc's ``MALLOC_*``, a preloaded allocator): they
    move a CPU run's page faults and speed (benchmarks/README.md), so results keep them."""
    return {k: v for k, v in env.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"}


def write(name: str, results: Any, table: str, load_before: float | None = None) -> str:
    """``load_before``: the 1-minute load average when the benchmark started (this machine is
    shared: a high load makes a run's numbers noise)."""
    os.makedirs(RESULTS, exist_ok=True)
    record = {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "commit": commit(),
        "load_average": {"before": load_before, "after": os.getloadavg()[0]},
        "machine": machine(),
        "results": results,
        "table": table,
    }
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print(table)
    print(f"\nwritten to {os.path.relpath(path)}")
    return path
