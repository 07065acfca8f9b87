"""The spawned worker written right: every rank reaches the barrier; rank 0 alone saves."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(gpu, ngpus_per_node):
    dist.init_process_group("gloo", rank=gpu, world_size=ngpus_per_node)
    if gpu == 0:
        torch.save({}, "model.pt")
    dist.barrier()


def main():
    mp.spawn(main_worker, nprocs=2, args=(2,))
