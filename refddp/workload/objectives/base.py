"""The objective: what training, evaluation and prediction ask of a task, in one interface.

The trainer never computes a loss itself. Per micro-batch it asks the objective for
``LossTerms``: the loss *summed* over the batch's targets and the number of targets. The
step's gradient is then the sum over every target of the global batch divided by their
global count (``refddp/training/steps.py``), whatever the world size or accumulation split. An
objective that cannot sum (the model returns a mean and nothing says over what) reports its
mean times the batch's samples, and ``exact = False``: micro-batch means, said at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from refddp.workload.objectives.batches import batch_size, model_inputs


class LossTerms(NamedTuple):
    """One micro-batch's loss: ``total`` summed over its ``count`` targets."""

    total: torch.Tensor
    count: torch.Tensor | int


class Objective:
    """A task's loss, evaluation sums and predictions. Subclasses: ``cross_entropy.py``,
    ``model_loss.py``, ``user_loss.py``; register a new one in
    ``refddp/workload/objectives/__init__``.

    ``check`` runs once on a first batch before any step (every rank alike) and raises a
    one-line ``ConfigError`` for a model or batch the objective cannot use; it may decide
    ``exact`` and ``sequence`` from what it sees.
    """

    name = ""
    exact = True  # LossTerms.total is a sum over targets (else: a mean times the samples)
    sequence = False  # targets are tokens: perplexity, and throughput in tokens
    targets_in_call = False  # the model is called with the targets (it computes the loss)
    # The evaluation sums, in the order every rank all-reduces them.
    sum_names: tuple[str, ...] = ("loss_sum", "targets")
    user_metrics: Any = None  # --metrics (``user_metrics.UserMetrics``), set by objective_for
    # The training data ignores no target (its ``every_target_scored``, which refddp's built-in
    # data sets): a loss may count a batch's targets on the host, as their number (an int),
    # instead of counting the scored ones on the device every step. Set by build_objective.
    count_on_host = False

    def count(self, batch: Any) -> torch.Tensor | int:
        """The targets of ``batch`` its loss is summed over, counted before the forward: the
        trainer agrees on the global batch's count while the forward runs and scales the loss by
        it before the backward (``refddp/training/steps.py``). ``LossTerms.count`` is the same."""
        raise NotImplementedError

    @property
    def counts_samples(self) -> bool:
        """Every sample is one target (``count`` is the batch size): the global count is the
        global batch, known without agreeing on it."""
        return not self.exact

    def forward(self, model: nn.Module, batch: Any) -> Any:
        args, kwargs = model_inputs(batch, self.targets_in_call)
        return model(*args, **kwargs)

    def batch_loss(self, model: nn.Module, batch: Any) -> LossTerms:
        """The loss of ``batch``: the model's forward, then ``loss``."""
        return self.loss(self.forward(model, batch), batch)

    def check(self, model: nn.Module, batch: Any) -> None:
        """Raise a one-line ConfigError if this model and batch cannot be used (no_grad, eval)."""
        self.batch_loss(model, batch)

    def loss(self, outputs: Any, batch: Any) -> LossTerms:
        raise NotImplementedError

    def eval_sums(self, outputs: Any, batch: Any) -> list[torch.Tensor | float]:
        """This batch's contribution to each of ``sum_names`` (summed over batches and ranks)."""
        total, count = self.loss(outputs, batch)
        return [total.detach().double(), count]

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The validation metrics from the sums over the whole validation set."""
        targets = sums["targets"]
        val_loss = sums["loss_sum"] / targets if targets else math.nan
        found = {"val_loss": val_loss}
        if sums.get("scored"):
            found["val_acc"] = sums["correct"] / sums["scored"]
        if self.sequence:
            found["val_perplexity"] = math.exp(val_loss) if val_loss < 700 else math.inf
        return found

    def predictions(self, outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
        """What the model output for each sample of ``batch`` (first dimension: the sample)."""
        return per_sample_outputs(outputs, batch_size(batch))

    def describe(self) -> str:
        """The start-up log's account of the loss and how it is normalised."""
        return self.name


def per_sample_outputs(outputs: Any, samples: int) -> dict[str, torch.Tensor]:
    """The tensors of a model's output that hold one entry per sample (a plain tensor as
    ``outputs``; a dict's or ``ModelOutput``'s per-sample fields by name), on the CPU, with
    ``prediction`` (the argmax over the last dimension) when there are ``logits``."""
    if isinstance(outputs, torch.Tensor):
        fields = {"outputs": outputs}
    elif isinstance(outputs, Mapping):
        fields = dict(outputs)
    else:
        fields = {k: v for k, v in vars(outputs).items() if not k.startswith("_")}
    found = {
        name: value.detach().float().cpu()
        if value.is_floating_point()
        else value.detach().cpu()
        for name, value in fields.items()
        if isinstance(value, torch.Tensor) and value.dim() and len(value) == samples
    }
    if "logits" in found:
        found["prediction"] = found["logits"].argmax(-1)
    return found


def logits_of(outputs: Any) -> torch.Tensor | None:
    """A model output's logits: the output itself if it is a tensor, else its ``logits``."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, Mapping):
        found = outputs.get("logits")
    else:
        found = getattr(outputs, "logits", None)
    return found if isinstance(found, torch.Tensor) else None
