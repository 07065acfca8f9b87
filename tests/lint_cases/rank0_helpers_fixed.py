"""Only local work is passed to the rank-0 helper; the flag is the same on every rank."""

import torch.distributed as dist


def rank0_then_meet(work):
    result = None
    if dist.get_rank() == 0:
        result = work()
    dist.barrier()
    return result


def write(path):
    with open(path, "w") as f:
        f.write("done")


def save(path):
    dist.barrier()
    rank0_then_meet(lambda: write(path))
    rank0_then_meet(lambda: print("saved", path))


def maybe_sync(flag, t):
    if flag:
        dist.all_reduce(t)


def step(t):
    maybe_sync(dist.get_world_size() > 1, t)
