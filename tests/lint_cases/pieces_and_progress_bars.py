"""One step beyond the other cases: a scatter's output is each rank's own piece; a shard's
batch count through ``math.ceil``; Hugging Face Trainer's rank-0 flags; a progress bar over
another loader than the other ranks'."""

import glob
import math

import torch
import torch.distributed as dist
from tqdm import tqdm


def scattered_shards():
    rank, world = dist.get_rank(), dist.get_world_size()
    files = sorted(glob.glob("data/*.pt")) if rank == 0 else None
    shards = [files[i::world] for i in range(world)] if rank == 0 else None
    mine = [None]
    dist.scatter_object_list(mine, shards, src=0)
    for name in mine[0]:  # each rank's own list of files: as long as its shard
        dist.all_reduce(torch.load(name))  # expect: RDL103


def batches_of_a_shard(files, batch_size):
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(math.ceil(len(files[rank::world]) / batch_size)):
        dist.barrier()  # expect: RDL103


def save_under_hf_flags(trainer, state):
    if trainer.is_world_process_zero():
        dist.barrier()  # expect: RDL101
    if state.is_local_process_zero:
        dist.barrier()  # expect: RDL101


def progress_over_another_loader(loader, shorter):
    batches = shorter
    if dist.get_rank() == 0:
        batches = tqdm(loader)
    for batch in batches:
        dist.all_reduce(batch)  # expect: RDL103
