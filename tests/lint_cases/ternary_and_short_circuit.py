"""Collectives inside a rank-dependent ternary and behind `and` / `or`."""

import torch.distributed as dist


def gather_stats(stats):
    rank = dist.get_rank()
    out = dist.all_gather_object([None], stats) if rank == 0 else None  # expect: RDL101
    rank == 0 and dist.barrier()  # expect: RDL101
    rank != 0 or dist.monitored_barrier()  # expect: RDL101
    return out
