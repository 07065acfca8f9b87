"""Ranks read from torchrun's and SLURM's variables, from a process group and a device mesh."""

import os
from os import environ

import torch.distributed as dist
from torch.distributed import get_rank


def by_environment(t, group, mesh):
    if os.getenv("LOCAL_RANK") == "0":
        dist.barrier()  # expect: RDL101
    if int(environ["SLURM_PROCID"]) == 0:
        dist.broadcast(t, src=0)  # expect: RDL101
    if os.environ.get("NODE_RANK", "0") == "0":
        dist.new_group([0, 1])  # expect: RDL101
    if get_rank(group) == 0:
        dist.all_reduce(t, group=group)  # expect: RDL101
    if mesh.get_local_rank() == 0:
        dist.all_reduce(t)  # expect: RDL101
    if dist.get_node_local_rank() == 0:
        dist.reduce(t, dst=0)  # expect: RDL101


def main(rank, world_size, t):  # mp.spawn's signature: the first parameter is the rank
    if rank == 0:
        dist.scatter(t, src=0)  # expect: RDL101


def computed_from_a_rank(rank):
    previous = rank - 1
    if previous == -1:  # rank 0 alone: not a test of whether the job is distributed
        dist.barrier()  # expect: RDL101


def in_a_group(group):
    group_rank = dist.get_rank(group)  # -1 on the processes outside the group
    if group_rank >= 0:
        dist.barrier()  # expect: RDL101


def in_a_group_by_another_name(group):
    rank = dist.get_rank(group)
    if rank >= 0:
        dist.barrier()  # expect: RDL101
