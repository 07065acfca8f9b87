"""What a run is built with besides its model and data: the optimizer (fused on CUDA where that
is safe) and the run directory, with the run's config written into it.

``Trainer`` builds these once, before its first step. They live apart from the loop so that the
choice of optimizer and of its kernel (``fuses_on_cuda``) reads, and is tested, on its own.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from refddp.checkpoints.run_files import writing
from refddp.config.command_line import save_yaml
from refddp.config.schema import TrainConfig
from refddp.config.validation import has_fused_kernel


def build_optimizer(model: nn.Module, c: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    """``fused``: torch's one-kernel-a-step implementation (``fuses_on_cuda``)."""
    if c.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum,
                               weight_decay=c.weight_decay, fused=fused or None)  # fmt: skip
    return torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=c.weight_decay,
                             fused=fused or None)  # fmt: skip


def fuses_on_cuda(c: TrainConfig, device: torch.device) -> bool:
    """Whether the optimizer is built fused: on CUDA, one kernel a step instead of a few per
    parameter group (the CPU keeps torch's default). Not SGD under FSDP (torch has no fused
    SGD for sharded parameters), nor under amp fp16, where a fused SGD once created its
    momentum buffer uninitialised on an overflowing first step; kept unfused until a GPU
    shows it right (docs/known-limitations.md)."""
    skips_unsafely = c.amp == "fp16" and c.optimizer == "sgd"
    return device.type == "cuda" and has_fused_kernel(c) and not skips_unsafely


def prepare_run_dir(c: TrainConfig) -> None:
    path = os.path.join(c.out, "config.yaml")
    with writing(path):
        os.makedirs(c.out, exist_ok=True)
        save_yaml(c, path)
