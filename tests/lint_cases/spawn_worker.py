"""A worker that ``mp.spawn`` starts, its process index named ``gpu`` as in PyTorch's ImageNet
example: the lint takes the first parameter of what ``mp.spawn`` starts as the rank."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(gpu, ngpus_per_node):
    dist.init_process_group("gloo", rank=gpu, world_size=ngpus_per_node)
    if gpu == 0:
        dist.barrier()  # expect: RDL101


def main():
    mp.spawn(main_worker, nprocs=2, args=(2,))


def other_worker(device, n):
    if device % n == 0:
        dist.all_reduce(torch.ones(1))  # expect: RDL101


if __name__ == "__main__":
    torch.multiprocessing.start_processes(other_worker, args=(2,), nprocs=2)
