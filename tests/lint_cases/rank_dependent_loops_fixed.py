"""The trip count agreed on every rank; a plain sharded loader is fine too."""

import torch
import torch.distributed as dist


def uneven_shards(items, world_size):
    rank = dist.get_rank()
    shard = items[rank::world_size]
    steps = torch.tensor(len(shard))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)  # every rank runs the same number of steps
    for i in range(int(steps.item())):
        dist.all_reduce(shard[i])


def loader_loop(loader, model, optimizer):
    for batch in loader:  # a DistributedSampler's loader: the same length on every rank
        loss = model(batch)
        dist.all_reduce(loss)
        optimizer.step()


def countdown(t):
    left = dist.get_world_size()
    while left > 0:
        dist.barrier()
        left -= 1


def preview(loader, t):
    for batch in loader:
        if dist.get_rank() == 0:
            if batch is None:
                break  # rank 0 stops printing; nothing in the loop communicates
            print(batch)
    dist.all_reduce(t)


def per_step_shards(x, steps):
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = [x[i * world + rank] for i in range(steps)]  # this rank's, as many as anyone's
    for batch in batches:
        dist.all_reduce(batch)
