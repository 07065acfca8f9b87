"""What leaving a skipped step no trace, and bit-exact resume at 3+ ranks, cost (issue 47).

    python benchmarks/skip_costs.py [--repeats 200]

1. ``BufferSnapshot.take`` (refddp/training/skips.py), made before every step: the copy of a
   model's floating buffers and counters, against the training step it precedes (forward,
   backward and AdamW step of one batch, one process), for models with and without
   BatchNorm. Medians of ``--repeats`` timings each.
2. ``settle_ddp_buckets`` (refddp/training/steps.py), once per run at 3+ DDP ranks: the first step of a 3-rank
   run with it against the same step without it (``first_backward_rebuilds`` off), medians of
   5 fresh trainers each, on the demo's MLP and a BatchNorm conv net.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))
from record import write  # noqa: E402

from refddp.training.skips import BufferSnapshot  # noqa: E402


def bn_mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def conv_net(channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10),
    )  # fmt: skip


MODELS = {  # name -> (model, one batch's input)
    "demo MLP (no buffers)": (lambda: nn.Sequential(nn.Linear(20, 128), nn.GELU(),
                                                    nn.Linear(128, 4)),
                              lambda: torch.randn(128, 20)),  # fmt: skip
    "MLP, 4 BatchNorm1d of 1024": (lambda: bn_mlp(1024, 4), lambda: torch.randn(256, 1024)),
    "conv net, 2 BatchNorm2d of 64, 32x32 images": (lambda: conv_net(64),
                                                    lambda: torch.randn(32, 3, 32, 32)),
}


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def snapshot_costs(repeats: int) -> list[dict]:
    rows = []
    for name, (make, batch) in MODELS.items():
        model, x = make(), batch()
        optimizer = torch.optim.AdamW(model.parameters())
        snapshot = BufferSnapshot(model)

        def step(model=model, x=x, optimizer=optimizer) -> None:
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step_s, take_s = median_s(step, repeats), median_s(snapshot.take, repeats * 10)
        rows.append({"model": name, "buffers": sum(b.numel() for b in snapshot.buffers),
                     "take_us": take_s * 1e6, "step_ms": step_s * 1e3,
                     "share": take_s / step_s})  # fmt: skip
    return rows


def first_step_s(out: str, model: str, settle: bool) -> float:
    """One rank's first training step of a fresh 3-rank trainer, with or without the settle."""
    from refddp.launch.dist import init_distributed
    from refddp.training.trainer import Trainer
    from tests.rank_tasks import tiny_config

    flags = dict(epochs=1, train_size=3 * 64 * 4, global_batch_size=3 * 64, batch_size=64,
                 hidden_size=128, input_dim=32, dtype="float32", model=model)  # fmt: skip
    trainer = Trainer(tiny_config(out, **flags), init_distributed("cpu"))
    trainer.bucket_layout_pending = settle
    batches = trainer.epoch_batches()
    torch.distributed.barrier()
    start = time.perf_counter()
    trainer.train_step(batches)
    return time.perf_counter() - start


def settle_costs() -> list[dict]:
    from refddp.testing import spawn_ranks

    rows = []
    for model in ("mlp", "convnet"):
        timed = {True: [], False: []}
        for _ in range(5):
            for settle in (False, True):
                with tempfile.TemporaryDirectory() as out:
                    timed[settle].append(max(spawn_ranks(first_step_s, out, model, settle,
                                                         world_size=3)))  # fmt: skip
        plain, settled = statistics.median(timed[False]), statistics.median(timed[True])
        rows.append({"model": model, "first_step_ms": plain * 1e3,
                     "with_settle_ms": settled * 1e3, "settle_ms": (settled - plain) * 1e3})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    a = parser.parse_args()
    torch.set_num_threads(1)
    snapshots, settles = snapshot_costs(a.repeats), settle_costs()
    lines = ["| model | buffer elements | take | step | share |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['buffers']:,} | {r['take_us']:.1f} µs | {r['step_ms']:.2f} ms "
              f"| {r['share']:.2%} |" for r in snapshots]  # fmt: skip
    lines += ["", "| 3-rank first step | without the settle | with it | the settle |",
              "|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['first_step_ms']:.1f} ms | {r['with_settle_ms']:.1f} ms | "
              f"{r['settle_ms']:+.1f} ms |" for r in settles]  # fmt: skip
    table = "\n".join(lines)
    print(table)
    write("skip_costs", {"snapshot": snapshots, "settle": settles}, table)


if __name__ == "__main__":
    main()
