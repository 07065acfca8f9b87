"""Write a benchmark's results with the machine, torch version and the command that made them."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
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


def write(name: str, results: Any, table: str) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    record = {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
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
