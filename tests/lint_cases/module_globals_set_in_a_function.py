"""A module global that a setup function assigns through a ``global`` statement, read by
another function of the module."""

import torch.distributed as dist

IS_MAIN = False


def setup():
    global IS_MAIN
    IS_MAIN = dist.get_rank() == 0


def log(t):
    if IS_MAIN:
        dist.all_reduce(t)  # expect: RDL101
