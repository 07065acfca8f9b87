"""Batch norm over the global batch on any device (``--sync-bn``).

torch's ``SyncBatchNorm`` only runs on GPUs; this one all-reduces the batch statistics with an
all-reduce that has a backward (``_SumOverRanks``), so it also runs on CPU with gloo.
With it, a BatchNorm model at world size N and per-rank batch b computes exactly what one
process computes on the batch N*b (up to reduction order): world-size invariance holds when
``grad_accum`` is 1. Each micro-batch is still normalised on its own, so accumulation changes
the statistics, as it does on one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _SumOverRanks(torch.autograd.Function):
    """Sum over ranks; its gradient is the sum of every rank's gradient (each rank's input
    contributes to every rank's output)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


def _sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    return _SumOverRanks.apply(x)


# torch's batch norms (SyncBatchNorm too) share a private base, which has no public name; on a
# torch without it, the public ones are found and GlobalBatchNorm builds on BatchNorm2d.
_BASE = getattr(nn.modules.batchnorm, "_BatchNorm", None)
BATCH_NORMS = (_BASE,) if _BASE is not None else (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class GlobalBatchNorm(_BASE or nn.BatchNorm2d):  # type: ignore[misc]
    """A BatchNorm whose training statistics are those of the batch over all ranks.

    Its parameters and buffers are BatchNorm's, under the same names: checkpoints load into the
    plain model (``nn.BatchNorm1d``/``2d``) in any process.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:  # the base's hook: any rank >= 2
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {input.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        # Statistics in float32 at least: under AMP a bf16 count of 990 rounds to 992, an fp16
        # one overflows past 65504.
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        count = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype, device=x.device)
        # Two passes (mean, then squared deviations): as exact as one process's batch norm.
        totals = _sum_over_ranks(torch.cat([x.sum(dims), count]))
        n = totals[-1]
        mean = totals[:-1] / n
        centred = x - mean.view(shape)
        var = _sum_over_ranks(centred.pow(2).sum(dims)) / n
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum
                if m is None:  # a cumulative average, as BatchNorm does
                    m = 1.0 / float(self.num_batches_tracked)
                self.running_mean.lerp_(mean.detach(), m)
                self.running_var.lerp_(var.detach() * n / (n - 1), m)
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def convert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """``model`` with every BatchNorm replaced by a ``GlobalBatchNorm`` holding its state.

    On GPUs torch's own ``SyncBatchNorm`` does the same job; this one is used everywhere so a
    run's numbers do not depend on the device kind.
    """
    if isinstance(model, BATCH_NORMS) and not isinstance(
        model, GlobalBatchNorm
    ):
        like = next(t for t in model.state_dict().values() if t.is_floating_point())
        synced = GlobalBatchNorm(
            model.num_features, model.eps, model.momentum, model.affine, model.track_running_stats
        ).to(device=like.device, dtype=like.dtype)
        synced.load_state_dict(model.state_dict())
        synced.train(model.training)
        return synced
    for name, child in model.named_children():
        model.add_module(name, convert_sync_batchnorm(child))
    return model
