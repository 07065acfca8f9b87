"""GPU: fp32 vs bf16 vs fp16 on a matmul-bound model, torch.compile on/off, MFU, peak memory.

    python benchmarks/gpu_precision.py

Needs one CUDA GPU; results go to results/gpu_precision.json with the device name. The model is
a deep, wide MLP so the time is in matmuls; MFU uses the bf16 dense peak in refddp.training.metrics.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

from refddp.training.metrics import PEAK_FLOPS  # noqa: E402
from refddp.workload.models import MLP  # noqa: E402

WIDTH, DEPTH, BATCH, STEPS, WARMUP = 8192, 8, 8192, 30, 10


def run(amp: str, compiled: bool) -> dict:
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = MLP(WIDTH, WIDTH, DEPTH, 16).to(device)
    step_model = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=amp == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    x = torch.randn(BATCH, WIDTH, device=device)
    y = torch.randint(0, 16, (BATCH,), device=device)
    torch.cuda.reset_peak_memory_stats()
    for i in range(WARMUP + STEPS):
        if i == WARMUP:
            torch.cuda.synchronize()
            begin = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(step_model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - begin) / STEPS
    params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    flops = 6 * params * BATCH / seconds
    return {
        "amp": amp,
        "compile": compiled,
        "step_ms": seconds * 1e3,
        "samples_per_s": BATCH / seconds,
        "tflops": flops / 1e12,
        "mfu_vs_bf16_peak": flops / peak if peak else None,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
    }


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("error: needs a CUDA GPU")
    rows = [run(amp, compiled) for compiled in (False, True) for amp in ("off", "bf16", "fp16")]
    header = f"{'amp':<5} {'compile':<8} {'step':>9} {'samples/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}"
    lines = [f"device: {torch.cuda.get_device_name()}", header] + [
        f"{r['amp']:<5} {str(r['compile']):<8} {r['step_ms']:>7.1f}ms {r['samples_per_s']:>10.0f} "
        f"{r['tflops']:>8.1f} {(r['mfu_vs_bf16_peak'] or 0):>6.1%} {r['peak_memory_gb']:>9.1f}"
        for r in rows
    ]
    write("gpu_precision", rows, "\n".join(lines))


if __name__ == "__main__":
    main()
