"""Ranks that leave early: return, raise, break and continue before the next collective."""

import os

import torch.distributed as dist


def evaluate(metrics):
    if dist.get_rank() != 0:
        return None
    dist.all_reduce(metrics)  # expect: RDL102
    return metrics


def check(path, t):
    if int(os.environ["LOCAL_RANK"]) == 0 and not os.path.exists(path):
        raise FileNotFoundError(path)
    dist.broadcast(t, src=0)  # expect: RDL102


def steps(batches, t):
    rank = dist.get_rank()
    for batch in batches:
        if rank == 1 and batch is None:
            break
        dist.all_reduce(t)  # expect: RDL102


def skip(batches, t):
    rank = dist.get_rank()
    for batch in batches:
        if rank > 0 and batch is None:
            continue
        dist.all_reduce(t)  # expect: RDL102


def stop_early(t, steps):
    for step in range(steps):
        dist.all_reduce(t)  # expect: RDL102
        if dist.get_rank() == 0 and step == 10:
            break
    dist.barrier()  # every rank gets here: not where they part
