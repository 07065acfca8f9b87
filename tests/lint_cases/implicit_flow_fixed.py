"""Broadcast first: what comes out of a collective is the same on every rank."""

import torch
import torch.distributed as dist


def load_on_rank0(path):
    box = [torch.load(path) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        dist.barrier()
