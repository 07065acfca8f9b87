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
import sys
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

# The demo's model (make demo: the small-step regime where per-step overhead shows), a larger
# MLP where compute hides it, and a small GPT-2 from transformers on byte-level text (issue
# 21: dict batches, the model computes its loss, throughput in tokens). Everything else is the
# trainer's default job.
MODELS = {
    "demo": {"hidden_size": 128, "depth": 2},
    "large": {"hidden_size": 512, "depth": 4},
    "gpt2": {"hidden_size": 64, "depth": 2},
    # GPT-2 at a size where one GPU's compute outlasts the host's work (its data fetched on
    # the main thread, num_workers=0): the regime where a host sync each step idles the device.
    "gpt2_wide": {"hidden_size": 768, "depth": 6},
    # GPT-2 at a size users train on the CPU (issue 38: a step of 20 ms or more): 4 blocks
    # 256 wide on 128-byte contexts, 8 sequences (~500 target tokens) a step.
    "gpt2_cpu": {"hidden_size": 256, "depth": 4},
    # GPT-2 small itself, 124M parameters (examples/gpt2_bytes.py ``gpt2_small``: its own
    # vocabulary, heads and 1,024-token context; the two numbers here are only its shape's
    # record), for one GPU (issue 47's bar), 8 sequences a step.
    "gpt2_124m": {"hidden_size": 768, "depth": 12},
}
GLOBAL_BATCH = 256
TRAIN_SIZE = 16384
VAL_SIZE = 2048
# The demo: 35 steady epochs of ~0.05 s (one process on this machine). At 12 (11 steady,
# ~0.55 s in all, until 2026-11-25) one hiccup moved a run's throughput by several percent.
EPOCHS = {"demo": 36, "large": 3, "gpt2": 3, "gpt2_wide": 2, "gpt2_cpu": 3, "gpt2_124m": 2}
LR = 3e-3
# GPT-2 small's own peak rate: at 3e-3 its 124M parameters can diverge, and a diverged run's
# non-finite steps (skipped by refddp, taken by a plain loop) would time different work.
LRS = {"gpt2_124m": 6e-4}
WEIGHT_DECAY = 0.01  # AdamW's default, stated: refddp's own default is 0.0
# The token jobs' data: 64-byte contexts, 16 sequences (~640 target tokens) per step (64 for
# the wide one), 64 steps per epoch.
GPT2 = {"input_dim": 64, "train_size": 1024, "val_size": 64, "global_batch": 16}
TOKEN_JOBS = {
    "gpt2": GPT2,
    "gpt2_wide": {**GPT2, "train_size": 4096, "global_batch": 64},
    "gpt2_cpu": {"input_dim": 128, "train_size": 256, "val_size": 32, "global_batch": 8},
    "gpt2_124m": {"input_dim": 1024, "train_size": 512, "val_size": 16, "global_batch": 8},
}
# The GPT-2 job's model and data are examples/gpt2_bytes.py, imported from the repository root
# (the baseline scripts run with this directory, not the root, first on sys.path).
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TensorBatches(Dataset):
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


@dataclass
class Job:
    model: str
    epochs: int = field(init=False)

    def __post_init__(self) -> None:
        self.epochs = EPOCHS[self.model]

    @property
    def tokens(self) -> bool:
        """Throughput counts target tokens (GPT-2), else samples."""
        return self.model in TOKEN_JOBS

    @property
    def gpt2(self) -> dict[str, int]:
        return TOKEN_JOBS[self.model]

    @property
    def lr(self) -> float:
        return LRS.get(self.model, LR)

    @property
    def global_batch(self) -> int:
        return self.gpt2["global_batch"] if self.tokens else GLOBAL_BATCH

    def refddp_flags(self) -> list[str]:
        """The same job as ``python -m refddp.train`` flags."""
        shape = MODELS[self.model]
        sizes = (self.gpt2["train_size"], self.gpt2["val_size"]) if self.tokens else (TRAIN_SIZE, VAL_SIZE)
        flags = [
            f"--hidden-size={shape['hidden_size']}",
            f"--depth={shape['depth']}",
            f"--global-batch-size={self.global_batch}",
            f"--train-size={sizes[0]}",
            f"--val-size={sizes[1]}",
            f"--epochs={self.epochs}",
            f"--lr={self.lr}",
            f"--weight-decay={WEIGHT_DECAY}",
            "--lr-schedule=constant",
            "--optimizer=adamw",
        ]
        if self.tokens:
            build = "gpt2_small" if self.model == "gpt2_124m" else "model"
            flags += [f"--model=examples.gpt2_bytes:{build}", "--data=examples.gpt2_bytes:data",
                      "--loss=model", "--dropout=0", f"--input-dim={self.gpt2['input_dim']}"]  # fmt: skip
        return flags

    def config(self):  # type: ignore[no-untyped-def]
        from refddp.config.command_line import merge, parse_cli

        return merge(parse_cli(self.refddp_flags())[0], {})

    def build(self) -> tuple[nn.Module, Dataset, Dataset]:
        """Model and data exactly as refddp builds them for these flags; the MLP's data fetched
        a batch at a time (``TensorBatches``), as refddp's built-in data is."""
        from refddp.workload.data import build_datasets
        from refddp.workload.models import build_model

        c = self.config()
        train, val = build_datasets(c)
        if not self.tokens:
            train, val = TensorBatches(train.x, train.y), TensorBatches(val.x, val.y)
        return build_model(c), train, val

    def loader(self, dataset: Dataset, batch: int, device: str = "cpu", **kwargs: Any) -> DataLoader:
        """On CUDA the batches come in pinned memory (copied with ``non_blocking``, ``to``), as
        refddp's do."""
        collate = None if self.tokens else first
        return DataLoader(dataset, batch, collate_fn=collate, pin_memory=device != "cpu", **kwargs)

    @staticmethod
    def to(batch: Any, device: torch.device) -> Any:
        """``batch`` (a tuple or a dict of tensors) on ``device``; the CPU's stays as it is."""
        if device.type == "cpu":
            return batch
        if isinstance(batch, dict):
            return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        return tuple(v.to(device, non_blocking=True) for v in batch)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The loss a hand-written loop computes: the model's own (a micro-batch mean), or
        cross entropy on its logits."""
        if self.tokens:
            return model(**batch).loss
        x, y = batch
        return F.cross_entropy(model(x), y)

    def units(self, batch: Any) -> int:
        """What one batch adds to throughput: its samples, or its target tokens (counted on the
        host copy, before the batch reaches a device)."""
        if self.tokens:
            return int((batch["labels"][:, 1:] != -100).sum())
        return len(batch[0])

    def score(self, model: nn.Module, batch: Any) -> tuple[float, int]:
        """(sum, count) of the per-epoch validation score: accuracy, or the GPT-2's loss."""
        if self.tokens:
            return float(model(**batch).loss) * len(batch["labels"]), len(batch["labels"])
        x, y = batch
        return float((model(x).argmax(1) == y).sum()), len(y)


class EpochClock:
    """Training-loop time per epoch; steady-state throughput skips the first epoch. It counts
    the job's units: samples, or target tokens."""

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


def steady_samples_per_s(history_path: str, key: str = "samples_per_s") -> float:
    """The same quantity from refddp's history.jsonl (one record per epoch, equal sample counts:
    the harmonic mean of the per-epoch rates is total samples over total time). ``key``:
    ``targets_per_s`` for tokens (epochs then hold nearly equal token counts: the same mean
    to a fraction of a percent)."""
    with open(history_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steady = records[1:] or records
    return len(steady) / sum(1.0 / r[key] for r in steady)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    return parser.parse_args()


def report(clock: EpochClock, val_score: float) -> None:
    """The one line the driver reads from a baseline's stdout (samples_per_s: the job's units
    per second)."""
    print(json.dumps({"samples_per_s": clock.samples_per_s(), "val_score": val_score}),
          flush=True)  # fmt: skip


def end() -> NoReturn:
    """Leave a baseline's process once it has reported, without interpreter shutdown.

    torch 2.13 with gloo: the default group outlives ``destroy_process_group`` (DDP imports
    ``torch.distributed.nn.functional`` after it exists, which binds it as a default
    argument), and its threads then either run into finalization, which aborts a finished
    2-rank run (SIGABRT, "terminate called without an active exception"), or, where the group
    is freed with the model, join while holding the GIL that one of them needs (a hang). refddp
    avoids both (``refddp/launch/dist.py``: ``teardown``, ``end_process``); a baseline's exit is not
    what it measures, so it ends the way ``end_process`` does: flush, then ``os._exit``."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def checkpoint_path(out: str) -> str:
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, "checkpoint.pth")
