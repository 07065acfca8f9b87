"""User code the tests name as ``package.module:callable``, as a real project would."""

import os

import torch
import torch.distributed as dist

from refddp.data import TensorPairDataset, synthetic


def tiny_linear(config):
    return torch.nn.Linear(config.input_dim, config.num_classes).to(getattr(torch, config.dtype))


def not_a_module(config):
    return {"weights": 1}


class RecordingDataset(torch.utils.data.Dataset):
    """Appends every index it serves to ``$REFDDP_TEST_RECORD/rank<R>.txt``."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        rank = dist.get_rank() if dist.is_initialized() else 0
        with open(os.path.join(os.environ["REFDDP_TEST_RECORD"], f"rank{rank}.txt"), "a") as f:
            f.write(f"{index}\n")
        return self.base[index]


def recording_datasets(config):
    train, val = synthetic(config)
    return RecordingDataset(train), val


def rank_dependent_datasets(config):
    """A user bug: each rank builds a differently sized training set."""
    train, val = synthetic(config)
    keep = len(train) - 16 * (dist.get_rank() if dist.is_initialized() else 0)
    return TensorPairDataset(train.x[:keep], train.y[:keep]), val


def exploding_datasets(config):
    """Training inputs that overflow to inf in the forward pass (for non-finite loss tests)."""
    train, val = synthetic(config)
    x = train.x.clone()
    x[: len(x) // 2] = float("inf")
    return TensorPairDataset(x, train.y), val
