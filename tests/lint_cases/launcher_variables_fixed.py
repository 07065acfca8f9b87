"""The world size and whether the job is distributed are the same on every rank."""

import os

import torch.distributed as dist


def by_environment(t):
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.barrier()
    if os.environ.get("RANK") is not None:
        dist.broadcast(t, src=0)
    if dist.get_world_size() > 1:
        dist.all_reduce(t)


def main(rank, world_size, t):
    if world_size > 1:
        dist.scatter(t, src=0)
    if rank == 0:
        print("scattered", t)


def by_device(local_rank):
    device = "cuda:%d" % local_rank  # noqa: UP031 (text: a label, the same kind on every rank)
    if device.startswith("cuda"):
        dist.barrier()


def unpacked(t):
    rank, world = dist.get_rank(), dist.get_world_size()
    if world > 1:  # the world size, unpacked beside the rank, is still the same everywhere
        dist.all_reduce(t)
    return rank


RANK = int(os.getenv("RANK", -1))  # YOLOv5's: -1 when not distributed


def set_or_not(model, args, local_rank, t):
    if RANK != -1:  # a rank compared with a value no rank takes: distributed or not
        dist.barrier()
    if args.local_rank != -1:
        dist.all_reduce(t)
    if local_rank is not None:
        dist.broadcast(t, src=0)
    if local_rank >= 0:
        dist.barrier()
