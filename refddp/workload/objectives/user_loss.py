"""``--loss package.module:callable``: the user's loss, called as ``fn(outputs, batch)``.

The model is called without the targets (a tuple's last element, a dict's ``labels``); ``fn``
gets its outputs and the whole batch. It returns either ``(loss_sum, count)`` (the loss summed
over the batch's ``count`` targets: refddp then normalises exactly, by the global batch's
count) or a scalar loss, taken to be the batch's mean: micro-batch means.

refddp needs a batch's count before the forward (it agrees on the global count while the
forward runs, and scales the loss by it before the backward). It counts the batch's targets
other than -100 (a dict's ``labels``, a tuple's last element), or calls ``fn.count(batch)``
where the function has a ``count`` attribute (for a loss that counts otherwise); the first
batch checks that this is the count ``fn`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from refddp.config.schema import ConfigError
from refddp.workload.objectives.base import LossTerms, Objective
from refddp.workload.objectives.batches import batch_size, scored_count, targets_of


class UserLoss(Objective):
    def __init__(self, spec: str, fn: Callable[[Any, Any], Any]):
        self.name, self.fn = spec, fn
        self.exact = True

    def count(self, batch: Any) -> torch.Tensor | int:
        if not self.exact:
            return batch_size(batch)
        if self.counter is not None:
            return self.counter(batch)
        try:
            return scored_count(targets_of(batch, self.name))
        except ConfigError:
            raise ConfigError(
                f"loss: {self.name} returns (loss_sum, count), and refddp counts a batch's "
                "targets before its forward from its labels (a dict's 'labels', a tuple's last "
                f"element), which this batch lacks: {self.count_hint}"
            ) from None

    @property
    def counter(self) -> Callable[[Any], Any] | None:
        """The loss function's own ``count(batch)``, if it has one."""
        counter = getattr(self.fn, "count", None)
        return counter if callable(counter) else None

    @property
    def count_hint(self) -> str:
        function = self.name.split(":")[-1]
        return f"give {function} a count(batch) attribute returning the count it divides by"

    def loss(self, outputs: Any, batch: Any) -> LossTerms:
        found = self.fn(outputs, batch)
        if isinstance(found, tuple | list) and len(found) == 2:
            total, count = found
            if not self.exact:
                raise _inconsistent(self.name)
            return LossTerms(_scalar(total, self.name), count)
        if self.exact:
            raise _inconsistent(self.name)
        samples = batch_size(batch)
        return LossTerms(_scalar(found, self.name) * samples, samples)

    def check(self, model: nn.Module, batch: Any) -> None:
        found = self.fn(self.forward(model, batch), batch)
        self.exact = isinstance(found, tuple | list) and len(found) == 2
        total = found[0] if self.exact else found
        _scalar(total, self.name)
        if self.exact and not isinstance(found[1], int | float | torch.Tensor):
            raise ConfigError(
                f"loss: {self.name} returned a count of type {type(found[1]).__name__}; "
                "(loss_sum, count) needs a number or a tensor count"
            )
        if self.exact:
            returned, counted = float(found[1]), float(self.count(batch))
            if returned != counted:
                how = "its count(batch)" if self.counter else "its targets other than -100"
                raise ConfigError(
                    f"loss: {self.name} returned a count of {returned:g} for the first batch, "
                    f"but {how} number {counted:g}; refddp counts each batch before its "
                    f"forward: {self.count_hint}"
                )

    def describe(self) -> str:
        if self.exact:
            return f"{self.name} (loss_sum, count), normalised by the global batch's target count"
        return f"{self.name} (a mean per batch): mean of micro-batch means"


def _scalar(value: Any, spec: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ConfigError(
            f"loss: {spec} must return a scalar tensor or (loss_sum, count), got "
            f"{type(value).__name__}"
            + (f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else "")
        )
    return value.reshape(())


def _inconsistent(spec: str) -> RuntimeError:
    return RuntimeError(
        f"loss: {spec} returned (loss_sum, count) on one batch and a scalar on another; "
        "return the same kind for every batch"
    )
