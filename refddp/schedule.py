"""The learning rate at each step: ``lr × lr_factor(step)``, a linear warm-up, then cosine to
zero or constant.

The trainer sets it on the optimizer's parameter groups itself rather than through a torch
``LRScheduler``: the schedule's only state is the step, which the checkpoint holds anyway, so a
resumed run takes its rate from the step and this invocation's ``lr``, ``lr_schedule`` and
``warmup_steps`` (all applied on resume), and a step whose rate does not change (a constant
schedule after its warm-up) costs a comparison. The checkpoint's ``scheduler_state_dict`` keeps
the layout torch's ``LambdaLR`` gives it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from refddp.config import TrainConfig


def lr_factor(c: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The rate at ``step`` (counted from 0) as a fraction of ``c.lr``."""

    def factor(step: int) -> float:
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.lr_schedule == "constant":
            return 1.0
        progress = (step - c.warmup_steps) / max(1, total_steps - c.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


class Schedule:
    """``c.lr × lr_factor(step)`` on every parameter group of ``optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer, c: TrainConfig, total_steps: int):
        self.optimizer = optimizer  # its param_groups: load_state_dict replaces the list
        self.lr = c.lr
        self.factor = lr_factor(c, total_steps)
        # The last step whose rate can differ from its predecessor's (cosine: the last step)
        self.last_change = c.warmup_steps if c.lr_schedule == "constant" else total_steps
        self.reset(0)

    def rate(self, step: int) -> float:
        """The learning rate of step ``step`` (counted from 0)."""
        return self.lr * self.factor(step)

    def reset(self, step: int) -> None:
        """The base rate (where torch's schedulers keep it) and step ``step``'s rate on every
        group: at the start, and on resume over the groups ``load_state_dict`` installed (the
        steps after may leave the rate alone)."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.lr
        self.at(step)

    def at(self, step: int) -> None:
        """Set the rate for step ``step`` (counted from 0): the next one the optimizer takes."""
        lr = self.rate(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def advance(self, step: int) -> None:
        """``at(step)`` after step ``step - 1``: nothing to do once the rate stays put."""
        if step <= self.last_change:
            self.at(step)

    def state_dict(self, step: int) -> dict[str, Any]:
        """The schedule at ``step``, as torch's ``LambdaLR`` saves itself (the checkpoint's
        ``scheduler_state_dict``; refddp reads only the step back, from the checkpoint)."""
        n = len(self.optimizer.param_groups)
        return {"base_lrs": [self.lr] * n, "last_epoch": step, "_step_count": step + 1,
                "_is_initial": False, "_get_lr_called_within_step": False,
                "_last_lr": [self.rate(step)] * n, "lr_lambdas": [None] * n}  # fmt: skip
