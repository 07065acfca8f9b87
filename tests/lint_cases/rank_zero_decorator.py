"""A function that only rank 0 runs (Lightning's rank_zero_only) issuing a collective."""

import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only


@rank_zero_only
def report(t):
    dist.all_reduce(t)  # expect: RDL101
    print(t)
