"""The fixed twins: every rank runs as many steps as the longest piece or shard (agreed with
an all-reduce); the flags guard the save, not the barrier. A progress bar on rank 0 alone
yields the loader's items, as many: no finding."""

import glob
import math

import torch
import torch.distributed as dist
from tqdm import tqdm


def scattered_shards():
    world = dist.get_world_size()
    everything = sorted(glob.glob("data/*.pt"))
    received = [None]  # rank 0's list, split: each rank gets its own part
    dist.scatter_object_list(received, [everything[i::world] for i in range(world)], src=0)
    mine = received
    longest = torch.tensor(len(mine[0]))
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    for i in range(int(longest)):
        dist.all_reduce(torch.load(mine[0][i]) if i < len(mine[0]) else torch.zeros(1))
    for piece in mine:  # one object on every rank
        dist.broadcast_object_list([piece], src=0)


def batches_of_a_shard(files, batch_size):
    rank, world = dist.get_rank(), dist.get_world_size()
    count = torch.tensor(math.ceil(len(files[rank::world]) / batch_size))
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    for _ in range(int(count)):
        dist.barrier()


def save_under_hf_flags(trainer, control):
    if control.should_save:  # TrainerControl's: every rank's
        dist.barrier()
    if trainer.is_world_process_zero():
        torch.save({"step": trainer.state.global_step}, "checkpoint.pt")
    dist.barrier()


def progress_on_rank_0(loader):
    shown = tqdm(loader) if dist.get_rank() == 0 else loader
    for batch in shown:
        dist.all_reduce(batch)
    batches = loader
    if dist.get_rank() == 0:
        batches = tqdm(batches, desc="epoch")
    for batch in batches:
        dist.all_reduce(batch)
