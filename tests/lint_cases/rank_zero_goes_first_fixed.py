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


def load_and_cache_examples(args, path, evaluate=False):
    """As Hugging Face's older examples write it: a flag every rank passes alike, in both."""
    if args.local_rank not in [-1, 0] and not evaluate:
        dist.barrier()
    data = download(path)
    if args.local_rank == 0 and not evaluate:
        dist.barrier()
    return data


@contextmanager
def ultralytics_zero_first(local_rank: int):
    initialized = dist.is_available() and dist.is_initialized()
    use_ids = dist.get_backend() == "nccl"
    if initialized and local_rank not in {-1, 0}:
        dist.barrier(device_ids=[local_rank]) if use_ids else dist.barrier()
    yield
    if initialized and local_rank == 0:
        dist.barrier(device_ids=[local_rank]) if use_ids else dist.barrier()


def synchronize():
    """detectron2's comm.synchronize: a barrier where there is more than one process."""
    if dist.get_world_size() == 1:
        return
    dist.barrier()


def through_a_helper(rank, path):
    if dist.get_world_size() > 1:
        if 0 != rank:
            synchronize()
        else:
            print("rank 0 prepares")
    data = download(path)
    if dist.get_world_size() > 1:
        if not rank:
            synchronize()
    return data


@contextmanager
def main_process_first_with_finally(is_main):
    """As Hugging Face's TrainingArguments.main_process_first writes it."""
    try:
        if not is_main:
            dist.barrier()
        yield
    finally:
        if is_main:
            dist.barrier()


def main(path, args):
    prepare(dist.get_rank(), path)
    inline(path)
    load_and_cache_examples(args, path)
    with ultralytics_zero_first(dist.get_rank()):
        download(path)
    through_a_helper(dist.get_rank(), path)
    with main_process_first_with_finally(dist.get_rank() == 0):
        download(path)
