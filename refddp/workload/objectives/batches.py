"""Batches of any structure: a tuple/list ``(inputs..., target)``, a dict (HF style:
``input_ids``, ``attention_mask``, ``labels``...), or nested ones, as default collation makes them.

How a batch reaches the model: a dict is passed as keyword arguments, a tuple or list
positionally. Where the objective computes the loss itself, the targets stay out of the call:
a tuple's last element, a dict's ``labels``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import default_collate

from refddp.config.schema import ConfigError
from refddp.launch import host_random

LABELS = "labels"  # a dict batch's targets (the Hugging Face convention)
IGNORE_INDEX = -100  # a target position that counts for nothing (padding): torch's and HF's


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it on ``device`` (non-blocking: pinned on CUDA)."""
    if isinstance(batch, torch.Tensor):  # (.to's dispatch skipped where it would return it)
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        moved = [to_device(v, device) for v in batch]
        named = hasattr(batch, "_fields")  # a named tuple takes its fields one by one
        return type(batch)(*moved) if named else type(batch)(moved)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    return batch


def scored_count(targets: torch.Tensor) -> torch.Tensor:
    """How many of ``targets`` count (are not ``IGNORE_INDEX``), on their device."""
    return torch.count_nonzero(targets.ne(IGNORE_INDEX))


def model_inputs(batch: Any, with_targets: bool) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` for the model: a dict as keywords, a tuple/list positionally, a
    lone tensor as the one argument; ``with_targets=False`` leaves the targets out."""
    if isinstance(batch, list | tuple):
        return (tuple(batch) if with_targets else tuple(batch[:-1])), {}
    if isinstance(batch, Mapping):
        return (), {k: v for k, v in batch.items() if with_targets or k != LABELS}
    return (batch,), {}


def targets_of(batch: Any, loss: str) -> torch.Tensor:
    """A batch's targets: a dict's ``labels``, a tuple's last element; one line if none."""
    if isinstance(batch, list | tuple) and len(batch) >= 2:
        found = batch[-1]
    elif isinstance(batch, Mapping):
        if LABELS not in batch:
            raise ConfigError(
                f"loss: {loss} needs the batch's targets, but this dict batch has no "
                f"{LABELS!r} (keys: {', '.join(map(str, batch))}); add labels, or use --loss model "
                "if the model computes its own loss"
            )
        found = batch[LABELS]
    else:
        raise ConfigError(
            f"loss: {loss} needs (inputs..., target) samples or dicts with {LABELS!r}; got "
            f"{describe(batch)}"
        )
    if not isinstance(found, torch.Tensor):
        raise ConfigError(f"loss: {loss} needs tensor targets, got {type(found).__name__}")
    return found


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of the first tensor in it."""
    if isinstance(batch, torch.Tensor):
        return len(batch) if batch.dim() else 1
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, list | tuple) or isinstance(batch, Mapping):
        for value in values:
            found = batch_size(value)
            if found:
                return found
    return 0


def describe(batch: Any) -> str:
    """``dict(input_ids: (8, 64) int64, labels: (8, 64) int64)``, ``tuple((8, 32) float32,
    (8,) int64)``: a batch's structure for an error message."""
    if isinstance(batch, torch.Tensor):
        return f"{tuple(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, Mapping):
        return "dict(" + ", ".join(f"{k}: {describe(v)}" for k, v in batch.items()) + ")"
    if isinstance(batch, list | tuple):
        return f"{type(batch).__name__}(" + ", ".join(describe(v) for v in batch) + ")"
    return type(batch).__name__


class NoTargets(ConfigError):
    """A probe batch whose every label is the ignore index (-100): nothing to check on it."""

    def __init__(self) -> None:
        super().__init__("loss: the batch has no targets (every label is -100): check the data")


def first_batch(dataset: Any, size: int) -> Any:
    """The first ``size`` samples of ``dataset``, collated as the loaders collate them."""
    return samples(dataset, range(min(size, len(dataset))))


def spread_indices(dataset: Any, count: int) -> list[int]:
    """``count`` indices evenly spread over ``dataset``, its first and last included."""
    count = min(count, len(dataset))
    step = (len(dataset) - 1) / max(count - 1, 1)
    return sorted({round(i * step) for i in range(count)})


def samples(dataset: Any, indices: Any) -> Any:
    """The samples of ``dataset`` at ``indices``, collated as the loaders collate them.

    Random augmentation in ``__getitem__`` must not shift the run's random streams: fetched
    under a fixed seed, with torch's, Python's and numpy's generators restored after."""
    torch_state, others = torch.get_rng_state(), host_random.states()
    try:
        torch.default_generator.manual_seed(0)  # the CPU's only: manual_seed reseeds GPUs
        return default_collate([dataset[i] for i in indices])
    finally:
        torch.set_rng_state(torch_state)
        host_random.set_states(others)
