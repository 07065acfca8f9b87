"""Built-in models and user models named by ``package.module:callable``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import is_import_path
from refddp.workload.imports import load_callable

BUILT_IN = ("mlp", "cnn", "convnet")


class MLP(nn.Module):
    def __init__(self, input_dim: int, hidden: int, depth: int, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """A 1-D convolutional net over the feature vector, with batch norm (a DDP buffer)."""

    def __init__(self, input_dim: int, hidden: int, depth: int, num_classes: int):
        super().__init__()
        channels = max(8, hidden // 8)
        blocks: list[nn.Module] = [nn.Conv1d(1, channels, 3, padding=1), nn.BatchNorm1d(channels)]
        for _ in range(max(depth - 1, 0)):
            blocks += [nn.GELU(), nn.Conv1d(channels, channels, 3, padding=1)]
        self.features = nn.Sequential(*blocks, nn.GELU(), nn.AdaptiveAvgPool1d(4))
        self.head = nn.Linear(channels * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)).flatten(1))


class ConvNet(nn.Module):
    """A small 1-D conv net with batch norm (batch-dependent, with buffers) and dropout (random).

    Which invariances hold for it is stated in the README: exact resume always; world-size
    invariance only with ``sync_bn``, ``grad_accum`` 1 and ``dropout`` 0.
    """

    def __init__(self, input_dim: int, hidden: int, depth: int, num_classes: int, dropout: float):
        super().__init__()
        channels = max(4, hidden // 4)
        blocks: list[nn.Module] = []
        width = 1
        for _ in range(max(depth, 1)):
            # no conv bias: the batch norm after it cancels it (its gradient is only rounding)
            conv = nn.Conv1d(width, channels, 3, padding=1, bias=False)
            blocks += [conv, nn.BatchNorm1d(channels), nn.ReLU()]
            width = channels
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool1d(4), nn.Flatten())
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels * 4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)))


def build_model(config: TrainConfig | dict[str, Any]) -> nn.Module:
    """The run's model, freshly initialised from ``seed``, in the run's dtype, on the CPU.

    Takes a ``TrainConfig`` or the ``config`` dict stored in a checkpoint. A ``model`` of the
    form ``package.module:callable`` is imported and called: that runs the module's code, so
    pass only configs whose import paths you trust. (The CLI refuses an import path that only
    a checkpoint names, unless ``--model`` or ``--trust-checkpoint-code`` says so.)
    """
    c = config if isinstance(config, TrainConfig) else TrainConfig(**config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.seed)
        if c.model == "mlp":
            model: nn.Module = MLP(c.input_dim, c.hidden_size, c.depth, c.num_classes)
        elif c.model == "cnn":
            model = SmallCNN(c.input_dim, c.hidden_size, c.depth, c.num_classes)
        elif c.model == "convnet":
            model = ConvNet(c.input_dim, c.hidden_size, c.depth, c.num_classes, c.dropout)
        elif is_import_path(c.model):
            model = load_callable(c.model, "model")(c)
            if not isinstance(model, nn.Module):
                raise ConfigError(
                    f"model: {c.model!r} returned {type(model).__name__}, not a torch.nn.Module"
                )
        else:
            raise ConfigError(
                f"model: {c.model!r} is not one of {', '.join(BUILT_IN)} or package.module:callable"
            )
    return model.to(getattr(torch, c.dtype))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
