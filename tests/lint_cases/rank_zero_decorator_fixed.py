"""The reduction before the rank-0-only report."""

import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only


@rank_zero_only
def report(t):
    print(t)


def reduce_and_report(t):
    dist.all_reduce(t)
    report(t)
