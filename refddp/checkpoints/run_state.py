"""The run state a training checkpoint carries, and continuing a run from it.

Which keys a checkpoint holds (``build_state``; ``REQUIRED_KEYS``, ``FORMAT_VERSION``), with
clean model keys (``clean_state_dict``) and every rank's random states (``rng_state``);
whether it fits this run (``check_model_compatible``, ``ON_RESUME``, the global batch); and
how it is loaded back into the model, optimizer, schedule, scaler, RNGs and position
(``restore``). Every checkpoint format stores this same state: how is
``refddp/checkpoints/formats.py``'s to say.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from refddp.checkpoints import formats as checkpoint_formats
from refddp.config.schema import (
    ON_RESUME,
    REFUSED,
    ConfigError,
    TrainConfig,
)
from refddp.config.validation import per_rank_batch_size
from refddp.launch import host_random

FORMAT_VERSION = 1  # bump when a key changes meaning; loading refuses newer checkpoints
REQUIRED_KEYS = (
    "model_state_dict",
    "optimizer_state_dict",
    "scaler_state_dict",
    "epoch",
    "step",
    "world_size",
    "config",
    "metrics",
)
_PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: printed as one line naming the file."""


# What a resumed run may change: each run field of TrainConfig declares it (``resume=``, in
# refddp/config/schema.py). Fields that describe one invocation (task, out, resume, nproc,
# stop_after, init_from, ...) are never taken from a checkpoint and are not listed.


@dataclass
class Position:
    """Where training is; saved in every checkpoint so resume continues exactly here."""

    step: int = 0  # training steps done (global batches consumed); the epoch derives from it
    skipped_steps: int = 0  # of them, skipped as non-finite (no update): refddp/training/skips.py
    skipped_in_a_row: int = 0  # the last ones skipped, up to ``step`` (0: the last was applied)
    best_val_loss: float = math.inf
    metrics: dict[str, Any] = field(default_factory=dict)
    eval_pending: bool = False  # a stop came before the evaluation due at `step` finished
    # Training measured since the last evaluation (``refddp.training.window.Window.saved``) and this
    # rank's [loss sum, targets]: the next evaluation's record covers the whole window.
    window: dict[str, Any] = field(default_factory=dict)

    @property
    def updates(self) -> int:
        """Optimizer updates applied: the learning-rate schedule's position."""
        return self.step - self.skipped_steps


class RunParts(NamedTuple):
    """The stateful objects a training checkpoint saves and restores.

    ``parallel`` (a ``refddp.training.parallel.Parallel``) holds the model: it gives and takes the
    full model and optimizer state in one layout, whether the model is replicated (DDP) or sharded
    (FSDP), so a checkpoint moves between strategies and world sizes.
    """

    parallel: Any
    optimizer: torch.optim.Optimizer
    schedule: Any  # refddp.training.schedule.Schedule
    scaler: torch.amp.GradScaler


def run_global_batch(state: dict[str, Any]) -> int:
    """The global batch of the run a checkpoint belongs to (older files: from its config)."""
    if "global_batch" in state:
        return int(state["global_batch"])
    cfg = state["config"]
    per_rank = cfg.get("batch_size", 128) * state["world_size"] * cfg.get("grad_accum", 1)
    return int(cfg.get("global_batch_size") or per_rank)


def refuse_changes(c: TrainConfig, state: dict[str, Any], path: str) -> None:
    """One line for the first ``refused`` field this invocation changes."""
    theirs = state["config"]
    for name, rule in ON_RESUME.items():
        if rule == REFUSED and name in theirs and theirs[name] != getattr(c, name):
            raise CheckpointError(
                f"{name}: the run being resumed from {path} has {theirs[name]!r}, this invocation "
                f"{getattr(c, name)!r}; a resumed run cannot change it (to start a new run from "
                f"its weights: --init-from {path} --out NEW_DIR)"
            )


def continue_run(
    c: TrainConfig, state: dict[str, Any], path: str, explicit: set[str]
) -> TrainConfig:
    """The config of a training run resumed from ``state``; ``explicit``: fields the user set.

    The run keeps its global batch: unless the user set a batch size, ``global_batch_size``
    becomes the run's, so the per-rank batch follows any new world size or ``grad_accum``.
    """
    refuse_changes(c, state, path)
    run = run_global_batch(state)
    if "global_batch_size" in explicit:
        if c.global_batch_size != run:
            raise CheckpointError(
                f"global_batch_size: {c.global_batch_size} would change the global batch of the "
                f"run being resumed from {path} ({run}); omit it to keep {run}"
            )
        return c
    if "batch_size" in explicit:  # checked against the world size by check_global_batch
        return dataclasses.replace(c, global_batch_size=0)
    return dataclasses.replace(c, global_batch_size=run)


def total_steps(c: TrainConfig, steps_per_epoch: int) -> int:
    """The step a run ends at: ``epochs`` of ``steps_per_epoch``, or ``max_steps`` if sooner."""
    epoch_steps = c.epochs * steps_per_epoch
    return min(epoch_steps, c.max_steps) if c.max_steps else epoch_steps


def refuse_an_end_behind(c: TrainConfig, step: int, total_steps: int, resumed_from: Any) -> None:
    """Refuse, in one line, a resume whose ``max_steps`` or ``epochs`` end the run before the
    step it has reached: it would report that step as done, past the end it was given."""
    if step <= total_steps:
        return
    field = "max_steps" if c.max_steps == total_steps else "epochs"  # the one that binds
    given = c.max_steps if field == "max_steps" else c.epochs
    raise CheckpointError(
        f"{field}: {given} ends the run at step {total_steps}, but the run resumed from "
        f"{resumed_from} is at step {step}; give a later end, or --resume never to start afresh"
    )


def check_global_batch(c: TrainConfig, world_size: int, state: dict[str, Any], path: str) -> None:
    """Refuse, in one line, a resume whose global batch would differ from the run's."""
    run = run_global_batch(state)
    parts = world_size * c.grad_accum
    if c.global_batch_size == run and run % parts:
        raise CheckpointError(
            f"{path}: the run's global batch {run} does not divide by {world_size} rank(s) x "
            f"grad_accum {c.grad_accum} = {parts}; resume at a world size x grad_accum that does"
        )
    ours = per_rank_batch_size(c, world_size) * parts
    if ours != run:
        raise CheckpointError(
            f"batch_size: {ours // parts} per rank x {world_size} rank(s) x grad_accum "
            f"{c.grad_accum} = global batch {ours}, but the run being resumed from {path} has "
            f"global batch {run}; omit batch_size to keep it"
        )


def build_state(
    parts: RunParts,
    pos: Position,
    c: TrainConfig,
    global_batch: int,
    steps_per_epoch: int,
    per_rank: list[dict[str, Any]],
    tensors: bool = True,
) -> dict[str, Any]:
    """A training checkpoint. ``per_rank``: every rank's ``{"rng": ..., "loss": [sum, n]}``.

    ``tensors=False``: the run state of a sharded (dcp) checkpoint, whose model and optimizer
    tensors each rank writes itself: no model state, and only the optimizer's param_groups.
    """
    epoch, done = divmod(pos.step, steps_per_epoch)
    if tensors:
        weights = {
            "model_state_dict": parts.parallel.model_state_dict(),
            "optimizer_state_dict": parts.parallel.optimizer_state_dict(parts.optimizer),
        }
    else:
        groups = parts.optimizer.state_dict()["param_groups"]
        weights = {"optimizer_state_dict": {"param_groups": groups}}
    return {
        "format_version": FORMAT_VERSION,
        **weights,
        "scheduler_state_dict": parts.schedule.state_dict(),
        "scaler_state_dict": parts.scaler.state_dict(),
        "epoch": epoch,
        "step": pos.step,
        "skipped_steps": pos.skipped_steps,
        "skipped_in_a_row": pos.skipped_in_a_row,
        "samples_in_epoch": done * global_batch,
        "global_batch": global_batch,
        "best_val_loss": pos.best_val_loss,
        "eval_pending": pos.eval_pending,
        "train_window": {**pos.window, "loss": [r["loss"] for r in per_rank],
                         "loss_unit": "target"},  # fmt: skip
        "world_size": len(per_rank),
        "config": c.to_dict(),
        "metrics": pos.metrics,
        "rng_states": [r["rng"] for r in per_rank],
    }


def restore(
    state: dict[str, Any],
    path: str,
    parts: RunParts,
    c: TrainConfig,
    rank: int,
    world_size: int,
    global_batch: int,
    steps_per_epoch: int,
) -> Position:
    """Load ``state`` into ``parts`` and this rank's RNGs; the position to continue from.

    Fields ``applied`` on resume (lr, weight_decay, momentum) replace the saved optimizer and
    schedule values, so what config.yaml records is what runs.
    """
    refuse_changes(c, state, path)
    check_global_batch(c, world_size, state, path)
    step = state["step"]
    samples = state["epoch"] * steps_per_epoch * global_batch + state.get("samples_in_epoch", 0)
    if samples != step * global_batch:
        raise CheckpointError(
            f"{path}: step {step} at global batch {global_batch} is {step * global_batch} "
            f"samples, but the checkpoint is at epoch {state['epoch']} after "
            f"{state.get('samples_in_epoch', 0)} samples of {steps_per_epoch} steps each: "
            "the training set changed; resume with the same data"
        )
    check_model_compatible(parts.parallel.model, state["model_state_dict"], path)
    _keep_kernels(state["optimizer_state_dict"]["param_groups"], parts.optimizer)
    checkpoint_formats.owning(path).restore_tensors(state, parts)
    skipped = state.get("skipped_steps", 0)  # (saved since refddp counts them)
    _apply_hyperparameters(parts, c, step - skipped)
    parts.scaler.load_state_dict(state["scaler_state_dict"])
    rng = state.get("rng_states") or []
    if len(rng) == world_size:
        set_rng_state(rng[rank])
    else:  # another world size: fresh, still deterministic, streams per rank
        fresh = c.seed + 7919 * step + rank
        torch.manual_seed(fresh)
        host_random.seed(fresh)  # Python's and numpy's too, as at a run's start
    window = dict(state.get("train_window") or {})
    losses = window.pop("loss", [])
    if window.pop("loss_unit", None) != "target" and losses:
        # Saved before losses were summed over targets: [sum of this rank's step means, steps],
        # one target per sample. The same mean, as [sum, targets]:
        per_step = global_batch / state["world_size"]
        losses = [[total * per_step, steps * per_step] for total, steps in losses]
    if len(losses) == world_size:
        window["loss"] = losses[rank]
    else:  # another world size: rank 0 carries the window's sums, as if it had run every step
        sums = [sum(x[0] for x in losses), sum(x[1] for x in losses)] if losses else [0.0, 0.0]
        window["loss"] = sums if rank == 0 else [0.0, 0.0]
    return Position(
        step=step,
        skipped_steps=skipped,
        skipped_in_a_row=state.get("skipped_in_a_row", 0),
        best_val_loss=state.get("best_val_loss", math.inf),
        metrics=state["metrics"],
        eval_pending=state.get("eval_pending", False),
        window=window,
    )


# How an optimizer runs, not what it computes: this invocation's choice (fused on CUDA, not on
# the CPU: ``run_setup.fuses_on_cuda``), whatever the saved run used.
KERNEL_KEYS = ("fused", "foreach", "capturable")


def _keep_kernels(saved_groups: list[dict[str, Any]], optimizer: torch.optim.Optimizer) -> None:
    """Give the saved param groups this optimizer's kernel choices before they are loaded:
    ``load_state_dict`` takes them from the checkpoint, and places the state by them (a fused
    optimizer keeps its step count on the parameter's device)."""
    # A different number of groups: load_state_dict refuses it below, in its own words.
    for saved, live in zip(saved_groups, optimizer.param_groups, strict=False):
        saved.update({key: live[key] for key in KERNEL_KEYS if key in live})


def _apply_hyperparameters(parts: RunParts, c: TrainConfig, updates: int) -> None:
    # load_state_dict restored the old run's lr, weight_decay and momentum; this invocation's
    # values replace them (identical floats when unchanged), the rate after ``updates``.
    for group in parts.optimizer.param_groups:
        group["weight_decay"] = c.weight_decay
        if "momentum" in group:
            group["momentum"] = c.momentum
    parts.schedule.reset(updates)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP and/or torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def clean_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """Strip ``module.`` and ``_orig_mod.`` from keys (for checkpoints saved by other tools)."""
    cleaned = {}
    for key, value in state.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


def check_model_compatible(model: nn.Module, state: dict[str, Any], path: str) -> None:
    """Fail with one line naming missing, unexpected and mis-shaped keys."""
    ours = unwrap(model).state_dict()
    theirs = clean_state_dict(state)
    missing = [k for k in ours if k not in theirs]
    unexpected = [k for k in theirs if k not in ours]
    shapes = [
        f"{k} {tuple(theirs[k].shape)} vs {tuple(ours[k].shape)}"
        for k in ours
        if k in theirs and tuple(theirs[k].shape) != tuple(ours[k].shape)
    ]

    def few(keys: list[str]) -> str:
        return ", ".join(keys[:4]) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "")

    problems = []
    if missing:
        problems.append(f"missing keys: {few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {few(unexpected)}")
    if shapes:
        problems.append(f"shape mismatch: {few(shapes)}")
    if problems:
        raise CheckpointError(f"{path}: does not fit this model; " + "; ".join(problems))


def rng_state() -> dict[str, Any]:
    """This process's random states, in types weights_only loading accepts."""
    python, (kind, keys, pos, has_gauss, gauss) = host_random.states()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": python,
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` saved."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    numpy_state = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
    host_random.set_states((state["python"], numpy_state))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
