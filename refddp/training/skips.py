"""Steps that are not applied: decided alike on every rank, undone, recorded and limited.

A step is skipped when its gradient norm is non-finite. After DDP's all-reduce every rank holds
the same gradient (FSDP's norm is one all-reduce of the shards' norms; parameters DDP ignores
get theirs agreed, ``refddp/training/parallel.py``), so every rank reads the same norm and takes the
same branch: the decision needs no collective of its own. What makes that hold, and what a
skipped step must not leave behind:

- ``spread_nonfinite``: a rank whose loss is non-finite gives its gradient a NaN scale, so the
  gradient reduction carries the NaN to every rank (a non-finite loss can have a finite
  gradient: cross-entropy against a logit of -inf).
- ``BufferSnapshot``: the model's buffers as they were before the step's forward, put back
  when it is skipped (BatchNorm's running statistics took the batch in during the forward,
  before anyone knew its gradient). Parameters, the optimizer state and the schedule change
  only in an update, which a skipped step never makes. What does advance: the data position
  (the step's batches are consumed) and the random streams (dropout's draws).
- ``end_scaler_iteration``: under amp fp16, GradScaler backs off for an overflow, and for
  nothing else.
- ``cause`` and ``run_ends``: why a step was skipped, and whether the run must end: a run
  that keeps skipping trains nothing and must not exit 0 (``max_consecutive_skips``; under
  amp fp16, a loss scale that would fall below ``min_loss_scale``; ``on_nonfinite=stop``).
- ``trained_nothing``: a run that reached its end without one update, however short, fp16
  overflows included, fails there.

The counts live in the run's ``Position`` (checkpoints carry them across a resume).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from refddp.config.schema import TrainConfig
from refddp.training.step_agreement import Nonfinite


def spread_nonfinite(scale: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """``scale`` where this rank's ``loss`` is finite, NaN where it is not.

    Multiplied into the loss before its backward, a NaN makes this rank's whole gradient NaN;
    the gradient reduction then carries it to every rank, and every rank skips the step on the
    same non-finite norm, with no collective of its own."""
    return scale + loss.detach() * 0  # 0 x inf and 0 x nan are nan


SMALL_BUFFER = 65_536  # elements: an integer or boolean buffer up to this is copied (512 KiB)


class BufferSnapshot:
    """The buffers a training forward may change, saved before each step and put back when
    the step is skipped.

    Which: every floating-point buffer (BatchNorm's and SyncBatchNorm's running statistics,
    any statistic a model registers) and every integer or boolean buffer of at most
    ``SMALL_BUFFER`` elements (counters such as BatchNorm's ``num_batches_tracked``, a mixture
    of experts' per-expert counts, position ids). Larger ones (GPT-2's causal masks, a
    megabyte each) are taken as constants no forward changes: copying them every step would
    cost the step. Each buffer is looked up by name at every
    ``take`` and ``restore``, so a forward that assigns a new tensor to it (``self.ema = 0.9 *
    self.ema + ...``) is put back too; the copies are made once, then refilled in place.
    Buffers are those the model registered when the snapshot was made.
    """

    def __init__(self, model: nn.Module):
        self.owners = [(module, name) for module in model.modules()
                       for name, _ in module.named_buffers(recurse=False)]  # fmt: skip
        self.saved: dict[tuple[int, str], torch.Tensor] = {}

    def take(self) -> None:
        for module, name in self.owners:
            buffer = getattr(module, name)
            if buffer is None or is_lazy(buffer):
                continue
            if not (buffer.is_floating_point() or buffer.numel() <= SMALL_BUFFER):
                continue
            key = (id(module), name)
            saved = self.saved.get(key)
            if saved is None or (saved.shape, saved.dtype, saved.device) != (
                buffer.shape, buffer.dtype, buffer.device
            ):
                saved = self.saved[key] = torch.empty_like(buffer)
            saved.copy_(buffer)

    def restore(self) -> None:
        for module, name in self.owners:
            saved = self.saved.get((id(module), name))
            if saved is not None:
                getattr(module, name).copy_(saved)


def end_scaler_iteration(scaler: torch.amp.GradScaler, bad_loss: bool
                         ) -> tuple[float, float] | None:  # fmt: skip
    """End GradScaler's iteration for a skipped step (its next ``unscale_`` needs an
    ``update``). Where its own check of the unscaled gradient saw an inf or NaN behind finite
    losses, that is an fp16 overflow: it backs off, and the scale before and after come back.
    Otherwise nothing changes, neither the scale nor its growth count: a non-finite loss
    (``bad_loss``) is no overflow, nor are finite gradients whose norm overflowed float32 (a
    smaller scale would not help either)."""
    kept = scaler.state_dict()  # the scale and its growth count before the step
    scaler.update()
    after = scaler.get_scale()
    if not bad_loss and after < kept["scale"]:
        return kept["scale"], after
    scaler.load_state_dict(kept)
    return None


def cause(found: Nonfinite, world_size: int, norm: float,
          overflow: tuple[float, float] | None, ending: bool = False) -> str:  # fmt: skip
    """Why a step is skipped: ``found.bad_ranks`` ranks' loss was non-finite; else the gradient
    was, behind finite losses, and ``overflow`` (the loss scale before and after GradScaler's
    backoff) says it was amp fp16's. A non-finite gradient of any other cause, and an overflow
    that ends the run (``ending``), names where it was (``where``), the first place to look;
    where every gradient is finite, their norm overflowed."""
    if found.bad_ranks:
        return f"non-finite loss on {found.bad_ranks} of {world_size} rank(s)"
    at = where(found)
    if overflow is not None:
        said = f"fp16 gradient overflow (loss scale {overflow[0]:g} -> {overflow[1]:g})"
        return f"{said}, {at}" if ending and at else said
    said = f"non-finite gradient (norm {norm}) behind a finite loss on every rank"
    if at:
        return f"{said}, {at}"
    if math.isinf(norm):  # finite gradients overflow to inf, never to NaN
        return f"{said}; every gradient is finite: their norm overflowed"
    return f"{said}; no trained parameter's gradient was found non-finite"


def where(found: Nonfinite) -> str:
    """``in a, b, c and 4 more``; ``in a, and in the parameters DDP ignores on ranks 1 and
    3``; "" where no gradient was non-finite."""
    parts = [_listed(found.parameters)] if found.parameters else []
    if found.ignored_on:
        many = "s" * (len(found.ignored_on) > 1)
        parts.append(f"the parameters DDP ignores on rank{many} {_listed(found.ignored_on)}")
    return "in " + ", and in ".join(parts) if parts else ""


def _listed(items: list, shown: int = 3) -> str:
    """``a``; ``a and b``; ``a, b, c and d``; ``a, b, c and 4 more``."""
    words = [str(item) for item in items]
    if len(words) > shown + 1:
        words = [*words[:shown], f"{len(words) - shown} more"]
    return f"{', '.join(words[:-1])} and {words[-1]}" if len(words) > 1 else words[0]


def run_ends(c: TrainConfig, in_a_row: int, overflow: tuple[float, float] | None) -> str:
    """Why the run must end after a skipped step, naming the option ("": it goes on).

    An fp16 overflow (``overflow``: the loss scale before and after the backoff) is GradScaler's
    to absorb, in ``stop`` mode too, while its scale stays at or above ``min_loss_scale``: a
    gradient that is non-finite at every scale that helps (a NaN, or an overflow at scale 1)
    cannot be told from an overflow until then. Any other non-finite step stops the run under
    ``on_nonfinite=stop``; and ``max_consecutive_skips`` skips in a row end any run."""
    if overflow is not None and overflow[1] < c.min_loss_scale:
        return (f"the fp16 loss scale fell below min_loss_scale {c.min_loss_scale:g}: the "
                "gradient is non-finite at every scale (a NaN, not an overflow)")  # fmt: skip
    if overflow is None and c.on_nonfinite == "stop":
        return "on_nonfinite=stop"
    if c.max_consecutive_skips and in_a_row >= c.max_consecutive_skips:
        return (f"{in_a_row} steps in a row skipped (max_consecutive_skips "
                f"{c.max_consecutive_skips}): the run trains nothing")  # fmt: skip
    return ""


def trained_nothing(step: int, in_a_row: int) -> str:
    """Why a run that reached its end at ``step``, its last ``in_a_row`` steps skipped, has
    failed ("": it has not): it skipped every step, so no update was ever applied. Whatever
    the limits: a 12-step run of NaN gradients stays under ``max_consecutive_skips``' 20, a
    short fp16 run of overflows above ``min_loss_scale``. The streak is counted across
    resumes (``Position``): a resumed run that trained before does not fail here."""
    if not step or in_a_row < step:
        return ""
    steps = "its only step was" if step == 1 else f"all {step} of its steps were"
    return (f"the run has ended and {steps} skipped as non-finite (history.jsonl says why): "
            "it trained nothing")  # fmt: skip
