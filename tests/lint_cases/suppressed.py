"""A finding silenced on its line: for every code, or for the one named."""

import torch.distributed as dist


def known(t):
    if dist.get_rank() == 0:
        dist.barrier()  # refddp: ignore
        dist.all_reduce(t)  # refddp: ignore[RDL101]
        dist.broadcast(t, src=0)  # refddp: ignore[RDL102]  # expect: RDL101
