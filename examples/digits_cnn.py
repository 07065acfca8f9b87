"""A 2-D convolutional network on scikit-learn's handwritten digits (8x8 grey images, 10
classes, 1,797 samples bundled with scikit-learn: nothing is downloaded).

    python -m refddp.train --config examples/digits_cnn.yaml --nproc 2 --out runs/digits

Samples are ``(image, class)`` pairs, ``image`` of shape ``(1, 8, 8)``; the default
``--loss cross_entropy`` applies. ``augment`` adds Gaussian noise to training images as they
are fetched (in the loader workers; the same noise at any world size or after a resume).

Config fields it reads: ``hidden_size`` (the dense layer), ``dropout``, ``augment``,
``val_size`` (held-out images), ``seed``, ``dtype``.
"""

from __future__ import annotations

import torch
from torch import nn

from refddp.workload.data import TensorPairDataset


def data(config):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=getattr(torch, config.dtype)).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(config.seed))
    val, train = order[: config.val_size], order[config.val_size :]
    return TensorPairDataset(x[train], y[train], config.augment), TensorPairDataset(x[val], y[val])


class DigitsCNN(nn.Module):
    def __init__(self, hidden: int, dropout: float):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def model(config):
    return DigitsCNN(config.hidden_size, config.dropout)
