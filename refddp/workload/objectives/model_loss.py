"""``--loss model``: the model computes its own loss, as Hugging Face models do given labels.

The whole batch goes to the model (a dict's ``labels`` included). Its output is the loss (a
scalar tensor) or carries it as ``loss`` (a key or an attribute, as HF's ``ModelOutput``).

Exact normalisation follows the convention HF's own Trainer uses: a model whose forward takes
``num_items_in_batch`` (HF's ``accepts_loss_kwargs``, or a ``**kwargs`` forward) divides its
summed loss by it; refddp passes 1, so the model returns the sum over the batch's targets, and
counts the targets as the model's loss does: the labels other than -100, from position 1 on for
a causal language model (its loss shifts the labels: position 0 is never a target), or
``shift_labels`` when the batch carries them. Which rule applies is measured on a first batch
before any step: the model's summed loss over its mean loss is its own count, which one of the
two rules must give. A model for which neither does, or that takes no ``num_items_in_batch``,
gets micro-batch means, and the start-up log says so.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from refddp.config.schema import ConfigError
from refddp.workload.objectives.base import LossTerms, Objective, logits_of
from refddp.workload.objectives.batches import (
    IGNORE_INDEX,
    LABELS,
    NoTargets,
    batch_size,
    describe,
    scored_count,
)

SHIFT_LABELS = "shift_labels"  # HF: the targets, already shifted (padding-free collators)


class ModelLoss(Objective):
    name = "model"
    targets_in_call = True
    sum_names = ("loss_sum", "targets", "correct", "scored")

    def __init__(self) -> None:
        self.exact = False
        self.shifts = False  # count labels[..., 1:] (a causal LM's loss shifts them)
        self.why = "not checked yet"
        self.model_name = "the model"

    def forward(self, model: nn.Module, batch: Any) -> Any:
        outputs = super().forward(model, batch) if not self.exact else model(
            **batch, num_items_in_batch=1
        )
        return outputs

    def loss_of(self, outputs: Any) -> torch.Tensor:
        if isinstance(outputs, torch.Tensor):
            loss = outputs
        elif isinstance(outputs, Mapping):
            loss = outputs.get("loss")
        else:
            loss = getattr(outputs, "loss", None)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            found = describe(loss) if isinstance(loss, torch.Tensor) else type(outputs).__name__
            raise ConfigError(
                f"loss: model: {self.model_name} returned no loss ({found}); --loss model needs "
                "a scalar tensor or an output with a loss (an HF model computes one when the "
                "batch has labels), or use --loss cross_entropy on its logits"
            )
        return loss.reshape(())

    def count(self, batch: Any) -> torch.Tensor | int:
        return self.labels_counted(batch) if self.exact else batch_size(batch)

    def labels_counted(self, batch: Any) -> torch.Tensor:
        """The batch's targets as the model's loss counts them."""
        if SHIFT_LABELS in batch:
            labels = batch[SHIFT_LABELS]
        else:
            labels = batch[LABELS][..., 1:] if self.shifts else batch[LABELS]
        return scored_count(labels)

    def loss(self, outputs: Any, batch: Any) -> LossTerms:
        loss = self.loss_of(outputs)
        if self.exact:
            return LossTerms(loss, self.labels_counted(batch))
        samples = batch_size(batch)
        return LossTerms(loss * samples, samples)

    def check(self, model: nn.Module, batch: Any) -> None:
        self.model_name = type(model).__name__
        self.exact = False
        mean = self.loss_of(self.forward(model, batch))
        labels = batch.get(LABELS) if isinstance(batch, Mapping) else None
        self.sequence = isinstance(labels, torch.Tensor) and labels.dim() >= 2
        if not isinstance(labels, torch.Tensor):
            self.why = "the batch is not a dict with labels to count"
            return
        if not _takes_num_items(model):
            self.why = f"{self.model_name}'s forward takes no num_items_in_batch"
            return
        counts = {}
        for shifts in (False, True):
            self.shifts = shifts
            counts[shifts] = int(self.labels_counted(batch))
        if not counts[False]:
            raise NoTargets()
        self.exact = True
        summed = float(self.loss_of(self.forward(model, batch)))
        # The model's own count is its summed loss over its mean loss: which rule gives it?
        fits = [
            shifts
            for shifts in (False, True)
            if math.isclose(summed, float(mean) * counts[shifts], rel_tol=1e-4, abs_tol=1e-9)
        ]
        if not fits:
            self.exact = False
            self.why = (
                f"{self.model_name}'s loss given num_items_in_batch=1 ({summed:.6g}) is not its "
                f"mean loss ({float(mean):.6g}) times the targets counted ({counts[False]} "
                f"labels, {counts[True]} from position 1 on)"
            )
            return
        # Both fit when no sequence's first label is a target: HF's rule decides.
        self.shifts = fits[0] if len(fits) == 1 else _hf_loss_shifts_labels(model)

    def eval_sums(self, outputs: Any, batch: Any) -> list[torch.Tensor | float]:
        total, count = self.loss(outputs, batch)
        correct, scored = _token_accuracy(logits_of(outputs), batch, self.shifts)
        return [total.detach().double(), count, correct, scored]

    def describe(self) -> str:
        if self.exact:
            rule = "labels[..., 1:]" if self.shifts else "labels"
            return (
                f"model ({self.model_name} computes it), normalised by the global batch's target "
                f"count: num_items_in_batch, targets counted as {rule} != -100"
            )
        return f"model ({self.model_name} computes it), mean of micro-batch means: {self.why}"


def _takes_num_items(model: nn.Module) -> bool:
    """HF's rule: ``accepts_loss_kwargs`` when the model says, else a forward with ``**kwargs``
    (or a ``num_items_in_batch`` parameter)."""
    said = getattr(model, "accepts_loss_kwargs", None)
    if said is not None:
        return bool(said)
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.kind == p.VAR_KEYWORD or p.name == "num_items_in_batch" for p in parameters)


def _hf_loss_shifts_labels(model: nn.Module) -> bool:
    """A Hugging Face causal LM (decoder-only) shifts its labels in its loss."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return False
    from transformers.loss.loss_utils import ForCausalLMLoss

    causal = getattr(model, "loss_function", None) is ForCausalLMLoss
    return causal and not getattr(model.config, "is_encoder_decoder", False)


def _token_accuracy(logits: torch.Tensor | None, batch: Any, shifts: bool) -> tuple[Any, Any]:
    """(correct, scored) argmax predictions against the labels, aligned as the loss aligns
    them; (0, 0) where the output has no logits of the labels' shape."""
    labels = batch.get(LABELS) if isinstance(batch, Mapping) else None
    if logits is None or not isinstance(labels, torch.Tensor):
        return 0, 0
    if logits.shape[:-1] != labels.shape:
        return 0, 0
    if shifts:
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    scored = labels != IGNORE_INDEX
    return ((logits.argmax(-1) == labels) & scored).sum(), scored.sum()
