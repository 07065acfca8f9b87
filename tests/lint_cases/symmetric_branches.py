"""Both sides issue the same collectives: every rank passes the same sequence."""

import torch
import torch.distributed as dist


def broadcast_from_zero(t):
    if dist.get_rank() == 0:
        t.fill_(1.0)
        dist.broadcast(t, src=0)
    else:
        dist.broadcast(t, src=0)


def save_a(t):
    dist.barrier()


def save_b(t):
    print("b")
    dist.barrier()


def either(t):
    rank = dist.get_rank()
    if rank == 0:
        save_a(t)
    else:
        save_b(t)
    if rank == 0:
        print("progress")
    if dist.get_world_size() > 1:
        dist.all_reduce(t)
    torch.save(t, "t.pt") if rank == 0 else None
