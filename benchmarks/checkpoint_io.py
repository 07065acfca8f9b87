"""Checkpoint save/load throughput against the disk's sequential write speed.

    python benchmarks/checkpoint_io.py [DIR]

A model of a few hundred MB (plus AdamW state), saved with refddp's atomic writer (temporary
file, fsync, rename, previous kept) and loaded with weights_only=True.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

from refddp.checkpoints import loading as ckpt  # noqa: E402
from refddp.checkpoints.full import write_checkpoint
from refddp.config.schema import TrainConfig  # noqa: E402
from refddp.workload.models import build_model  # noqa: E402


def disk_write_speed(directory: str, size: int) -> float:
    block = os.urandom(1 << 24)
    path = os.path.join(directory, "dd.bin")
    begin = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - begin
    os.remove(path)
    return size / seconds


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else None
    c = TrainConfig(hidden_size=4096, depth=4)
    model = build_model(c)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, c.input_dim)).sum().backward()
    opt.step()  # materialise AdamW's moments
    state = {
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": opt.state_dict(),
        "scaler_state_dict": {},
        "epoch": 0,
        "step": 1,
        "world_size": 1,
        "config": c.to_dict(),
        "metrics": {},
    }
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        plain = []  # before: torch.save with its defaults (CRC32 on), same fsync
        for _ in range(3):
            begin = time.perf_counter()
            with open(os.path.join(tmp, "plain.pth"), "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            plain.append(time.perf_counter() - begin)
        os.remove(os.path.join(tmp, "plain.pth"))
        saves, loads = [], []
        for _ in range(3):
            begin = time.perf_counter()
            path = write_checkpoint(state, tmp, is_best=False)
            saves.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            ckpt.load_checkpoint(path)
            loads.append(time.perf_counter() - begin)
        size = os.path.getsize(path)
        # Same size and best-of-3 as the saves: a virtual disk's cache can absorb bursts.
        disk = max(disk_write_speed(tmp, size) for _ in range(3))
    save_rate, load_rate = size / min(saves), size / min(loads)
    plain_rate = size / min(plain)
    result = {
        "checkpoint_mb": size / 2**20,
        "model_mb": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20,
        "save_mb_per_s": save_rate / 2**20,
        "load_mb_per_s": load_rate / 2**20,
        "torch_save_default_mb_per_s": plain_rate / 2**20,
        "disk_sequential_write_mb_per_s": disk / 2**20,
        "save_vs_disk": save_rate / disk,
    }
    table = (
        f"checkpoint {result['checkpoint_mb']:.0f} MB (model {result['model_mb']:.0f} MB + AdamW state)\n"
        f"save (atomic, fsync)  {result['save_mb_per_s']:7.0f} MB/s  "
        f"({result['save_vs_disk']:.2f}x the disk's sequential write)\n"
        f"torch.save defaults   {result['torch_save_default_mb_per_s']:7.0f} MB/s  "
        "(before: CRC32 on, which torch.load never checks)\n"
        f"load (weights_only)   {result['load_mb_per_s']:7.0f} MB/s\n"
        f"disk sequential write {result['disk_sequential_write_mb_per_s']:7.0f} MB/s (same size, fsync)"
    )
    write("checkpoint_io", result, table)


if __name__ == "__main__":
    main()
