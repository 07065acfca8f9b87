"""GPU leases: under ``pytest -n auto`` each worker holds disjoint devices (file locks)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from typing import IO

LOCK_DIR = os.path.join(tempfile.gettempdir(), "refddp-gpu-leases")


def visible_gpu_count() -> int:
    """CUDA devices this process can see (0 without CUDA); does not initialise CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_skip_reason(needed: int) -> str | None:
    """Why a test needing ``needed`` GPUs cannot run here, or None if it can."""
    found = visible_gpu_count()
    if found >= needed:
        return None
    return f"needs {needed} CUDA GPU(s) with NCCL, found {found}"


class GpuLease:
    """Exclusive use of ``count`` GPU indices among all processes on this machine."""

    def __init__(self, count: int, timeout_s: float):
        self.count = count
        self.timeout_s = timeout_s
        self.devices: tuple[int, ...] = ()
        self._locks: list[IO[str]] = []

    def __enter__(self) -> GpuLease:
        os.makedirs(LOCK_DIR, exist_ok=True)
        total = visible_gpu_count()
        deadline = time.monotonic() + self.timeout_s
        while True:
            for index in range(total):
                if len(self._locks) == self.count:
                    break
                f = open(os.path.join(LOCK_DIR, f"gpu{index}.lock"), "a+")  # noqa: SIM115
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self._locks.append(f)
                self.devices += (index,)
            if len(self._locks) == self.count:
                return self
            self.release()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not lease {self.count} of {total} GPUs within {self.timeout_s:g} s: "
                    "other test workers hold them"
                )
            time.sleep(0.2)

    def release(self) -> None:
        for f in self._locks:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._locks, self.devices = [], ()

    def __exit__(self, *exc: object) -> None:
        self.release()
