""""Rank 0 goes first", written right: the other ranks wait at one barrier while rank 0
prepares, and rank 0 meets them at another. Every rank issues one barrier."""

from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def torch_distributed_zero_first(local_rank: int):
    """As YOLOv5 writes it (-1: not distributed)."""
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])


@contextmanager
def main_process_first(is_main):
    if not is_main:
        dist.barrier()
    yield
    if is_main:
        dist.barrier()


def download(path):
    return path


def prepare(rank, path):
    with torch_distributed_zero_first(rank):
        data = download(path)
    with main_process_first(rank == 0):
        data = download(path)
    return data


def inline(path):
    if dist.get_rank() > 0:
        dist.barrier()
    data = download(path)
    if 0 == dist.get_rank():
        dist.barrier()
    return data


def main(path):
    prepare(dist.get_rank(), path)
    inline(path)
