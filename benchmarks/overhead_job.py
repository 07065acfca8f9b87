"""The job that trainer_overhead.py runs three ways: refddp, a plain DDP loop, HF Accelerate.

One definition of the job (model size, data, global batch, optimizer, epochs) and of how
throughput is counted, shared by the two baseline scripts and the driver, so the three can only
differ in the loop around the model.

Throughput is steady-state training throughput: samples trained per second of training-loop
time, counting every epoch but the first (warm-up, loader start) and no evaluation or save
time. refddp's history records the same quantity per epoch (``samples_per_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field

import torch
from torch import nn

# The demo's model (make demo: the small-step regime where per-step overhead shows) and a
# larger MLP where compute hides it. Everything else is the trainer's default job.
MODELS = {
    "demo": {"hidden_size": 128, "depth": 2},
    "large": {"hidden_size": 512, "depth": 4},
}
GLOBAL_BATCH = 256
TRAIN_SIZE = 16384
VAL_SIZE = 2048
EPOCHS = {"demo": 12, "large": 3}  # demo: 11 steady epochs of ~0.1-0.25 s; fewer were noise
LR = 3e-3
WEIGHT_DECAY = 0.01  # AdamW's default, stated: refddp's own default is 0.0


@dataclass
class Job:
    model: str
    epochs: int = field(init=False)

    def __post_init__(self) -> None:
        self.epochs = EPOCHS[self.model]

    def refddp_flags(self) -> list[str]:
        """The same job as ``python -m refddp.train`` flags."""
        shape = MODELS[self.model]
        return [
            f"--hidden-size={shape['hidden_size']}",
            f"--depth={shape['depth']}",
            f"--global-batch-size={GLOBAL_BATCH}",
            f"--train-size={TRAIN_SIZE}",
            f"--val-size={VAL_SIZE}",
            f"--epochs={self.epochs}",
            f"--lr={LR}",
            f"--weight-decay={WEIGHT_DECAY}",
            "--lr-schedule=constant",
            "--optimizer=adamw",
        ]

    def build(self) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Model and data exactly as refddp builds them for these flags."""
        from refddp.config import TrainConfig
        from refddp.data import synthetic
        from refddp.models import build_model

        c = TrainConfig(
            **MODELS[self.model], train_size=TRAIN_SIZE, val_size=VAL_SIZE, epochs=self.epochs
        )
        train, val = synthetic(c)
        return build_model(c), train.x, train.y, val.x, val.y


class TensorBatches(torch.utils.data.Dataset):
    """Fetches a whole batch with one indexing op (``__getitems__``), as refddp's built-in data
    does; ``first`` as the loader's collate_fn passes that batch through."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        idx = torch.as_tensor(indices)
        return [(self.x[idx], self.y[idx])]


def first(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    return items[0]


class EpochClock:
    """Training-loop time per epoch; steady-state throughput skips the first epoch."""

    def __init__(self) -> None:
        self.epochs: list[tuple[int, float]] = []  # (samples, seconds)
        self._start = 0.0

    def start(self) -> None:
        self._start = time.perf_counter()

    def stop(self, samples: int) -> None:
        self.epochs.append((samples, time.perf_counter() - self._start))

    def samples_per_s(self) -> float:
        steady = self.epochs[1:] or self.epochs
        return sum(s for s, _ in steady) / sum(t for _, t in steady)


def steady_samples_per_s(history_path: str) -> float:
    """The same quantity from refddp's history.jsonl (one record per epoch, equal sample counts:
    the harmonic mean of the per-epoch rates is total samples over total time)."""
    with open(history_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steady = records[1:] or records
    return len(steady) / sum(1.0 / r["samples_per_s"] for r in steady)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def report(clock: EpochClock, val_acc: float) -> None:
    """The one line the driver reads from a baseline's stdout."""
    print(json.dumps({"samples_per_s": clock.samples_per_s(), "val_acc": val_acc}), flush=True)


def checkpoint_path(out: str) -> str:
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, "checkpoint.pth")
