"""Helpers that run a function on rank 0 and then meet: what is passed to them must not
communicate. And a flag passed in by the caller."""

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


def sync_and_write(path):
    dist.barrier()
    write(path)


def save(path):
    rank0_then_meet(lambda: write(path))
    rank0_then_meet(lambda: sync_and_write(path))  # expect: RDL104
    rank0_then_meet(lambda: dist.barrier())  # expect: RDL104


def maybe_sync(flag, t):
    if flag:
        dist.all_reduce(t)  # expect: RDL101


def step(t):
    maybe_sync(dist.get_rank() == 0, t)
    maybe_sync(True, t)
