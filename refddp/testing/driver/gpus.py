"""GPU leases: under ``pytest -n auto`` each worker holds disjoint devices (file locks).

Devices are named by what this process's ``CUDA_VISIBLE_DEVICES`` lists (under Slurm
``CUDA_VISIBLE_DEVICES=4,5`` means GPUs 4 and 5), so ranks get the parent's GPUs and two
workers with overlapping masks contend for the same physical devices. One lease per process
grows as bigger worlds need more devices: a size-1 test and then a size-2 test reuse the
first device instead of waiting on their own lock.
"""

from __future__ import annotations

import fcntl
import os
import re
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


def visible_devices() -> list[str]:
    """The devices this process may use, in CUDA order, as ``CUDA_VISIBLE_DEVICES`` entries.

    Entries of the inherited mask (indices, ``GPU-<uuid>`` or MIG names) when one is set, else
    ``"0"`` .. ``"N-1"``. Handing a subset of these to a rank's ``CUDA_VISIBLE_DEVICES`` gives it
    exactly those devices.
    """
    count = visible_gpu_count()
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in mask.split(",") if entry.strip()][:count]


def gpu_skip_reason(needed: int) -> str | None:
    """Why a test needing ``needed`` GPUs cannot run here, or None if it can."""
    found = visible_gpu_count()
    if found >= needed:
        return None
    return f"needs {needed} CUDA GPU(s) with NCCL, found {found}"


class GpuLease:
    """Exclusive use of ``count`` of this process's visible GPUs among all processes here.

    ``devices`` are ``CUDA_VISIBLE_DEVICES`` entries (see ``visible_devices``). ``grow(n)``
    keeps the devices already held and adds more.
    """

    def __init__(self, count: int, timeout_s: float):
        self.count = count
        self.timeout_s = timeout_s
        self.devices: tuple[str, ...] = ()
        self._locks: list[IO[str]] = []

    def __enter__(self) -> GpuLease:
        self.grow(self.count, self.timeout_s)
        return self

    def grow(self, count: int, timeout_s: float) -> tuple[str, ...]:
        """Hold at least ``count`` devices (those already held first); wait at most
        ``timeout_s`` for other processes to free enough."""
        os.makedirs(LOCK_DIR, exist_ok=True)
        candidates = visible_devices()
        held = len(self._locks)
        deadline = time.monotonic() + timeout_s
        while True:
            for device in candidates:
                if len(self._locks) >= count:
                    break
                if device in self.devices:
                    continue
                name = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
                f = open(os.path.join(LOCK_DIR, f"gpu-{name}.lock"), "a+")  # noqa: SIM115
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self._locks.append(f)
                self.devices += (device,)
            if len(self._locks) >= count:
                self.count = len(self._locks)
                return self.devices
            self._release_from(held)  # all or nothing: do not sit on a partial set
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not lease {count} of {len(candidates)} GPUs within {timeout_s:g} s: "
                    "other test workers hold them"
                )
            time.sleep(0.2)

    def _release_from(self, index: int) -> None:
        for f in self._locks[index:]:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._locks, self.devices = self._locks[:index], self.devices[:index]

    def release(self) -> None:
        self._release_from(0)

    def __exit__(self, *exc: object) -> None:
        self.release()


_process_lease: GpuLease | None = None


def lease_devices(count: int, timeout_s: float) -> tuple[str, ...]:
    """The first ``count`` devices of this process's one lease, grown if it holds fewer."""
    global _process_lease
    if _process_lease is None:
        _process_lease = GpuLease(0, timeout_s)
    return _process_lease.grow(count, timeout_s)[:count]


def release_devices() -> None:
    """Give back every device this process leased (between tests under xdist, at exit)."""
    if _process_lease is not None:
        _process_lease.release()
