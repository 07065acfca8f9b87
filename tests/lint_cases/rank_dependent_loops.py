"""Loops whose trip count differs between ranks: over a shard, over range(rank), while."""

import torch.distributed as dist


def uneven_shards(items, world_size):
    rank = dist.get_rank()
    shard = items[rank::world_size]
    for item in shard:
        dist.all_reduce(item)  # expect: RDL103


def by_rank(t):
    for _ in range(dist.get_rank()):
        dist.broadcast(t, src=0)  # expect: RDL103


def countdown(t):
    left = dist.get_rank() + 2
    while left > 0:
        dist.barrier()  # expect: RDL103
        left -= 1
