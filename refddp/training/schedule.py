"""The learning rate of each optimizer update: ``lr × lr_factor(k)`` for the k-th, a linear
warm-up, then cosine to zero or constant, through torch's own ``LambdaLR``.

The schedule counts updates applied, not steps: a step skipped as non-finite leaves it where it
was (``refddp/training/skips.py``), as Megatron-LM's and Hugging Face's trainers do. A resumed
run takes its rate from the checkpoint's update count and this invocation's ``lr``,
``lr_schedule`` and ``warmup_steps`` (all applied on resume): the scheduler is rebuilt there
rather than loaded, so a changed ``lr`` takes effect. The checkpoint's
``scheduler_state_dict`` is ``LambdaLR``'s own (refddp reads only the step back).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from refddp.config.schema import TrainConfig


def lr_factor(c: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The rate of update ``step`` (counted from 0) as a fraction of ``c.lr``."""

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

    def rate(self, update: int) -> float:
        """The learning rate of update ``update`` (counted from 0)."""
        return self.lr * self.factor(update)

    def reset(self, updates: int) -> None:
        """The rate of update ``updates`` (counted from 0) on every group, from this
        invocation's ``lr``: at the start, and on resume over the groups the optimizer's
        ``load_state_dict`` installed."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.lr  # LambdaLR's base rate, which it needs to start late
        # LambdaLR's first step (in its constructor) moves it to last_epoch + 1 = updates.
        self.scheduler = LambdaLR(self.optimizer, self.factor, last_epoch=updates - 1)

    def advance(self, updates: int) -> None:
        """Set the rate of update ``updates`` (counted from 0), once update ``updates - 1``
        has been applied (an optimizer step came first: LambdaLR checks)."""
        if self.scheduler.last_epoch + 1 != updates:
            raise RuntimeError(
                f"schedule at update {self.scheduler.last_epoch}, asked for {updates}"
            )
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """``LambdaLR``'s state, the checkpoint's ``scheduler_state_dict``."""
        return self.scheduler.state_dict()
