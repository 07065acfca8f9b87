"""A worker that ``mp.spawn`` starts, its process index named ``gpu`` as in PyTorch's ImageNet
example: the lint takes the first parameter of what ``mp.spawn`` starts as the rank."""

import functools

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


def configured_worker(proc, cfg):
    if proc == 0:
        dist.barrier()  # expect: RDL101


def worker_after_cfg(cfg, proc):
    if proc == 0:
        dist.barrier()  # expect: RDL101


class Launcher:
    def run(self):
        mp.spawn(self.worker, nprocs=2)
        mp.spawn(Launcher.static_worker, nprocs=2)

    def worker(self, index):
        if index == 0:
            dist.barrier()  # expect: RDL101

    @staticmethod
    def static_worker(index):
        if index == 0:
            dist.barrier()  # expect: RDL101


def lambda_worker(proc, n):
    if proc == 0:
        dist.barrier()  # expect: RDL101


def launch_all(cfg):
    mp.spawn(functools.partial(configured_worker, cfg=cfg), nprocs=2)
    mp.spawn(functools.partial(worker_after_cfg, cfg), nprocs=2)
    mp.spawn(lambda i: lambda_worker(i, 2), nprocs=2)

    def nested(proc):
        if proc == 0:
            dist.barrier()  # expect: RDL101

    mp.spawn(nested, nprocs=2)


if __name__ == "__main__":
    torch.multiprocessing.start_processes(other_worker, args=(2,), nprocs=2)
