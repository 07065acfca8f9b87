"""What a run optimises and measures: ``--loss`` and ``--metrics``.

One interface (``base.Objective``): the loss of a micro-batch as (sum, target count), the
evaluation sums and metrics, the per-sample predictions. Implementations, one file each:
``cross_entropy.py`` (the default: classes per sample or per token), ``model_loss.py`` (the
model computes its loss, HF style), ``user_loss.py`` (``package.module:callable``). A new
built-in objective is one file plus one line in ``BUILT_IN``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import is_import_path
from refddp.workload.imports import load_callable
from refddp.workload.objectives.base import LossTerms, Objective
from refddp.workload.objectives.batches import (
    NoTargets,
    first_batch,
    samples,
    spread_indices,
    to_device,
)
from refddp.workload.objectives.cross_entropy import CrossEntropy
from refddp.workload.objectives.model_loss import ModelLoss
from refddp.workload.objectives.user_loss import UserLoss
from refddp.workload.objectives.user_metrics import UserMetrics

__all__ = ["LossTerms", "Objective", "build_objective", "BUILT_IN"]

BUILT_IN: dict[str, Callable[[], Objective]] = {
    "cross_entropy": CrossEntropy,
    "model": ModelLoss,
}
PROBE_SAMPLES = 8  # the first batch every rank checks the objective on, before any step


def objective_for(c: TrainConfig) -> Objective:
    """The objective ``c.loss`` names (unchecked: ``build_objective`` checks it)."""
    if c.loss in BUILT_IN:
        objective = BUILT_IN[c.loss]()
    elif is_import_path(c.loss):
        objective = UserLoss(c.loss, load_callable(c.loss, "loss"))
    else:
        raise ConfigError(
            f"loss: {c.loss!r} is not one of {', '.join(BUILT_IN)} or package.module:callable"
        )
    objective.user_metrics = (
        UserMetrics(c.metrics, load_callable(c.metrics, "metrics")) if c.metrics else None
    )
    return objective


def checked_across(objective: Objective, model: nn.Module, dataset: Any,
                   device: torch.device) -> Any:  # fmt: skip
    """Check ``objective`` on samples spread over ``dataset``, one at a time (a batch no
    larger than the run's), up to the first with targets, which it returns; none: one line."""
    for index in spread_indices(dataset, PROBE_SAMPLES):
        sample = to_device(samples(dataset, [index]), device)
        try:
            objective.check(model, sample)
        except NoTargets:
            continue
        return sample
    raise ConfigError(
        f"loss: no targets in the first batch nor in {PROBE_SAMPLES} samples spread over the "
        "dataset (every label is -100): check the data"
    )


def build_objective(
    c: TrainConfig,
    model: nn.Module,
    dataset: Any,
    device: torch.device,
    precision: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Objective:
    """The run's objective, checked on the first samples of ``dataset`` with ``model`` (the
    bare model, before DDP or FSDP wraps it): a model or batch it cannot use is one line here,
    before any step. Runs in eval mode without gradients: nothing of the run changes."""
    objective = objective_for(c)
    objective.count_on_host = getattr(dataset, "every_target_scored", False) is True
    batch = to_device(first_batch(dataset, min(PROBE_SAMPLES, c.batch_size)), device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), precision():
            try:
                objective.check(model, batch)
            except NoTargets:  # leading unlabelled samples, say: look across the dataset
                batch = checked_across(objective, model, dataset, device)
            if objective.user_metrics is not None:
                outputs = objective.forward(model, batch)
                objective.user_metrics.check(outputs, batch)
    finally:
        model.train(was_training)
    return objective
