"""What a history record measures besides the losses (memory and model FLOPs utilisation),
and the record's log line."""

from __future__ import annotations

import resource
from typing import Any

import torch
from torch import nn

from refddp.launch.dist import world_size
from refddp.workload.models import count_parameters

# bf16 dense peak FLOP/s by device name, for MFU (public spec-sheet numbers).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,
    "RTX 4090": 165e12,
}


def peak_memory_mb(device: torch.device) -> float:
    """This rank's peak memory: the GPU's allocator on CUDA, else the process's RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def model_flops_utilisation(
    model: nn.Module, device: torch.device, samples_per_s: float
) -> float | None:
    """The share of the GPU's bf16 peak this rank's training reaches (None off CUDA or for a
    device not in ``PEAK_FLOPS``)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    if peak is None:
        return None
    # ~6 FLOPs per parameter per sample (forward 2, backward 4) for dense layers.
    return 6 * count_parameters(model) * samples_per_s / world_size() / peak


def describe_record(record: dict[str, Any], sequence: bool) -> str:
    """An evaluation's log line: the losses, the validation metrics that apply, throughput."""
    parts = [f"train_loss {record['train_loss']:.4f}", f"val_loss {record['val_loss']:.4f}"]
    names = {"val_perplexity": "val_ppl"}
    parts += [f"{names.get(k, k)} {v:.4f}" for k, v in record.items()
              if k.startswith("val_") and k != "val_loss" and isinstance(v, float)]  # fmt: skip
    if sequence:
        parts.append(f"{record['targets_per_s']:.0f} tokens/s ({record['samples_per_s']:.0f} "
                     "samples/s)")  # fmt: skip
    else:
        parts.append(f"{record['samples_per_s']:.0f} samples/s")
    return " ".join(parts)
