"""GPU leases: concurrent test workers get disjoint devices; too few GPUs means skip, not wait."""

import os
import subprocess
import sys

import pytest

from refddp.testing.driver import gpus

LEASE_AND_REPORT = """
import sys
from refddp.testing.driver import gpus
gpus.visible_gpu_count = lambda: 4
gpus.LOCK_DIR = sys.argv[1]
with gpus.GpuLease(2, timeout_s=30) as lease:
    print(",".join(map(str, lease.devices)), flush=True)
    sys.stdin.readline()  # hold the lease until the parent has seen both workers' devices
"""


def test_two_workers_lease_disjoint_gpus(tmp_path):
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", LEASE_AND_REPORT, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        leased = [set(map(int, w.stdout.readline().split(","))) for w in workers]
    finally:
        for w in workers:
            w.communicate("\n", timeout=30)
    assert all(len(devices) == 2 for devices in leased)
    assert leased[0].isdisjoint(leased[1])


@pytest.fixture
def two_gpus_behind_a_slurm_mask(tmp_path, monkeypatch):
    """This process sees 2 GPUs, and they are physical GPUs 4 and 5."""
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: 2)
    monkeypatch.setattr(gpus, "LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setattr(gpus, "_process_lease", None)
    yield
    gpus.release_devices()


def test_a_bigger_world_grows_the_process_lease_instead_of_waiting_on_itself(
    two_gpus_behind_a_slurm_mask,
):
    assert gpus.lease_devices(1, timeout_s=0.3) == ("4",)
    assert gpus.lease_devices(2, timeout_s=0.3) == ("4", "5")
    assert gpus.lease_devices(1, timeout_s=0.3) == ("4",)


def test_ranks_get_the_parents_masked_devices(two_gpus_behind_a_slurm_mask, tmp_path):
    from refddp.testing.driver.pool import rank_environment

    devices = gpus.lease_devices(2, timeout_s=0.3)
    env = rank_environment("nccl", True, devices, str(tmp_path), world_size=len(devices))
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5", "rank r must use GPU 4+r, not GPU r"


def test_leases_lock_physical_devices_across_different_masks(two_gpus_behind_a_slurm_mask):
    gpus.lease_devices(1, timeout_s=0.3)  # GPU 4
    other_mask = subprocess.run(
        [sys.executable, "-c", OTHER_MASK, gpus.LOCK_DIR],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "4,6"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other_mask.stdout.strip() == "6", other_mask.stderr


OTHER_MASK = """
import sys
from refddp.testing.driver import gpus
gpus.visible_gpu_count = lambda: 2
gpus.LOCK_DIR = sys.argv[1]
print(",".join(gpus.lease_devices(1, timeout_s=5)))
"""


def test_busy_gpus_time_out_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: 1)
    monkeypatch.setattr(gpus, "LOCK_DIR", str(tmp_path))
    with (
        gpus.GpuLease(1, timeout_s=5),
        pytest.raises(TimeoutError, match="could not lease 1 of 1 GPUs"),
    ):
        with gpus.GpuLease(1, timeout_s=0.3):
            pass


def test_too_few_gpus_is_a_skip_reason_naming_both_counts(monkeypatch):
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: 1)
    assert gpus.gpu_skip_reason(2) == "needs 2 CUDA GPU(s) with NCCL, found 1"
    assert gpus.gpu_skip_reason(1) is None
