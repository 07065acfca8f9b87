"""``--loss cross_entropy`` (the default): classification, per sample or per token.

The model returns logits (a tensor, or an output with ``logits``) of shape ``[*targets, C]``:
``[B, C]`` against class targets ``[B]``, ``[B, T, C]`` against token targets ``[B, T]``.
Targets equal to -100 (padding) count for nothing. Targets are not shifted: a causal language
model's data gives ``labels[t]`` as the token after position ``t`` (or use ``--loss model``,
whose HF models shift it themselves).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from refddp.config.schema import ConfigError
from refddp.workload.objectives.base import LossTerms, Objective, logits_of
from refddp.workload.objectives.batches import (
    IGNORE_INDEX,
    NoTargets,
    describe,
    scored_count,
    targets_of,
)


class CrossEntropy(Objective):
    name = "cross_entropy"
    sum_names = ("loss_sum", "targets", "correct", "scored")

    def logits(self, outputs: Any) -> torch.Tensor:
        if isinstance(outputs, torch.Tensor):  # (the common case, each step: no look)
            return outputs
        logits = logits_of(outputs)
        if logits is None:
            raise ConfigError(
                "loss: cross_entropy needs the model to return logits (a tensor, or an output "
                f"with logits), got {type(outputs).__name__}; use --loss model if the model "
                "computes its own loss"
            )
        return logits

    def count(self, batch: Any) -> torch.Tensor | int:
        targets = targets_of(batch, self.name)
        if self.count_on_host:  # nothing is ignored: every target counts
            return targets.numel()
        return scored_count(targets)

    @property
    def counts_samples(self) -> bool:
        return self.count_on_host and not self.sequence

    def loss(self, outputs: Any, batch: Any) -> LossTerms:
        logits = self.logits(outputs)
        return LossTerms(_summed_loss(logits, targets_of(batch, self.name)), self.count(batch))

    def check(self, model: nn.Module, batch: Any) -> None:
        outputs = self.forward(model, batch)
        logits, targets = self.logits(outputs), targets_of(batch, self.name)
        if targets.is_floating_point() or targets.dtype == torch.bool:
            raise ConfigError(
                f"loss: cross_entropy needs integer class targets, got {describe(targets)}"
            )
        if logits.dim() < 2 or logits.shape[:-1] != targets.shape:
            raise ConfigError(
                f"loss: cross_entropy: the model's output {describe(logits)} does not fit the "
                f"targets {describe(targets)}: it needs shape {(*targets.shape, 'classes')} "
                "(per-sample or per-token logits)"
            )
        scored = targets[targets != IGNORE_INDEX]
        if not len(scored):
            raise NoTargets()
        classes = logits.shape[-1]
        if scored.min() < 0 or scored.max() >= classes:
            raise ConfigError(
                f"loss: cross_entropy targets must lie in [0, {classes}) (the model's classes) "
                f"or be -100 (ignored); found {int(scored.min())}..{int(scored.max())}"
            )
        self.sequence = targets.dim() >= 2

    def eval_sums(self, outputs: Any, batch: Any) -> list[torch.Tensor | float]:
        logits, targets = self.logits(outputs), targets_of(batch, self.name)
        # Half-precision (AMP) logits are upcast for the loss; float64 ones stay float64.
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        total, count = _summed(logits, targets)
        correct = ((logits.argmax(-1) == targets) & (targets != IGNORE_INDEX)).sum()
        return [total.double(), count, correct, count]

    def predictions(self, outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
        logits = self.logits(outputs).detach().float().cpu()
        return {"logits": logits, "prediction": logits.argmax(-1)}

    def describe(self) -> str:
        unit = "token" if self.sequence else "sample"
        return (
            f"cross_entropy per {unit}, normalised by the global batch's target count "
            "(labels -100 ignored)"
        )


def _summed(logits: torch.Tensor, targets: torch.Tensor) -> LossTerms:
    """The loss summed over the scored targets, and their count (on the device)."""
    return LossTerms(_summed_loss(logits, targets), scored_count(targets))


def _summed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if logits.dim() > 2:  # per token: [B, T, C] against [B, T]
        logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
