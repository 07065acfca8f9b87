"""The ceiling for trainer_overhead.py: the DDP loop people write by hand, doing the same job as
``refddp.train`` (overhead_job.py: same model, data and batched data path, global batch,
optimizer; each epoch trains, evaluates and saves a checkpoint on rank 0).

    python benchmarks/plain_ddp_loop.py --model demo --out DIR                  # 1 process
    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp_loop.py --model demo --out DIR

Prints one JSON line: steady-state training samples/s (overhead_job.EpochClock) and val_acc.
One process trains the bare model (no DDP), the fastest loop there is.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_job import GLOBAL_BATCH, LR, WEIGHT_DECAY, EpochClock, Job, TensorBatches, checkpoint_path, first, parse_args, report  # noqa: E402, I001


def main() -> None:
    args = parse_args()
    job = Job(args.model)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    model, x, y, val_x, val_y = job.build()
    if distributed:
        model = DDP(model)
    bare = model.module if distributed else model
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    train = TensorBatches(x, y)
    sampler = DistributedSampler(train, world, rank, seed=0, drop_last=True)
    loader = DataLoader(train, GLOBAL_BATCH // world, sampler=sampler, drop_last=True,
                        collate_fn=first)  # fmt: skip
    val = TensorBatches(val_x, val_y)
    val_loader = DataLoader(val, GLOBAL_BATCH, collate_fn=first,
                            sampler=DistributedSampler(val, world, rank, shuffle=False))  # fmt: skip
    clock = EpochClock()
    for epoch in range(job.epochs):
        sampler.set_epoch(epoch)
        clock.start()
        samples = 0
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            samples += len(xb) * world
        clock.stop(samples)
        correct = torch.zeros(2)
        with torch.no_grad():
            for xb, yb in val_loader:
                correct += torch.tensor([(bare(xb).argmax(1) == yb).sum(), len(yb)])
        if distributed:
            dist.all_reduce(correct)
        if rank == 0:
            state = {"model": bare.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            torch.save(state, checkpoint_path(args.out))
        if distributed:
            dist.barrier()
    if rank == 0:
        report(clock, float(correct[0] / correct[1]))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
