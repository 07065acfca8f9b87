"""The fixed twin: the global says where to print, and every rank all-reduces."""

import torch.distributed as dist

IS_MAIN = False


def setup():
    global IS_MAIN
    IS_MAIN = dist.get_rank() == 0


def log(t):
    dist.all_reduce(t)
    if IS_MAIN:
        print(t)


def outer():
    rank = dist.get_rank()  # a local here: only the nested function's is global

    def mark():
        global rank
        rank = 0

    return mark, rank


def report(t):
    if rank == 0:  # the module's, set by mark() alone: the same everywhere
        dist.all_reduce(t)


rank = 0
