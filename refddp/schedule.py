"""The learning rate at each step: ``lr × lr_factor(step)``, a linear warm-up, then cosine to
zero or constant, through torch's own ``LambdaLR``.

A resumed run takes its rate from the step and this invocation's ``lr``, ``lr_schedule`` and
``warmup_steps`` (all applied on resume): the scheduler is rebuilt at the checkpoint's step
rather than loaded, so a changed ``lr`` takes effect. The checkpoint's
``scheduler_state_dict`` is ``LambdaLR``'s own (refddp reads only the step back).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

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
        self.optimizer = optimizer
        self.lr = c.lr
        self.factor = lr_factor(c, total_steps)
        self.reset(0)

    def rate(self, step: int) -> float:
        """The learning rate of step ``step`` (counted from 0)."""
        return self.lr * self.factor(step)

    def reset(self, step: int) -> None:
        """Step ``step``'s rate on every group, from this invocation's ``lr``: at the start, and
        on resume over the groups the optimizer's ``load_state_dict`` installed."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.lr  # LambdaLR's base rate, which it needs to start late
        # LambdaLR's first step (in its constructor) moves it to last_epoch + 1 = step.
        self.scheduler = LambdaLR(self.optimizer, self.factor, last_epoch=step - 1)
        self.first_advance = True

    def advance(self, step: int) -> None:
        """Set the rate of step ``step`` (counted from 0), once step ``step - 1`` is done."""
        if self.scheduler.last_epoch + 1 != step:
            raise RuntimeError(f"schedule at step {self.scheduler.last_epoch}, asked for {step}")
        if not self.first_advance:
            self.scheduler.step()
            return
        self.first_advance = False
        with warnings.catch_warnings():
            # LambdaLR's first step warns when no optimizer step came before it: here a
            # skipped update (a non-finite step, fp16's overflow), which is no misuse.
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)`")
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """``LambdaLR``'s state, the checkpoint's ``scheduler_state_dict``."""
        return self.scheduler.state_dict()
