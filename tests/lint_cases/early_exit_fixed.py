"""Every rank reaches each collective before it leaves; the decision to stop is agreed."""

import os

import torch
import torch.distributed as dist


def evaluate(metrics):
    dist.all_reduce(metrics)
    if dist.get_rank() != 0:
        return None
    return metrics


def check(path, t):
    missing = torch.tensor(float(int(os.environ["LOCAL_RANK"]) == 0 and not os.path.exists(path)))
    dist.all_reduce(missing)  # every rank learns whether rank 0 lacks the file
    if missing.item():
        raise FileNotFoundError(path)
    dist.broadcast(t, src=0)


def steps(batches, t):
    for batch in batches:
        stop = torch.tensor(float(batch is None))
        dist.all_reduce(stop)  # the same decision on every rank
        if stop.item():
            break
        dist.all_reduce(t)


def done_early(t):
    if dist.get_rank() == 0:
        dist.barrier()
        return
    dist.barrier()  # the other branch met the same barrier before it returned
