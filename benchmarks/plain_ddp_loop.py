"""The baseline for trainer_overhead.py: a minimal hand-written DDP loop doing the same work as
`refddp.train` (same model, data and data path, global batch, optimizer, epochs, one eval, one
save).

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp_loop.py OUT_DIR
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from refddp.config import TrainConfig
from refddp.data import SeededFetch, collate_batch, synthetic
from refddp.models import MLP

CONFIG = dict(
    train_size=65536,
    val_size=4096,
    hidden_size=512,
    depth=4,
    batch_size=256,
    epochs=1,
    lr_schedule="constant",
)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = TrainConfig(**CONFIG)
    train, val = synthetic(c)
    torch.manual_seed(c.seed)
    model = DDP(MLP(c.input_dim, c.hidden_size, c.depth, c.num_classes))
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr)
    sampler = DistributedSampler(train, world, rank, seed=c.seed, drop_last=True)
    start = time.perf_counter()
    for epoch in range(c.epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(
            SeededFetch(train, c.seed, epoch),  # the same whole-batch fetch refddp's loader uses
            batch_size=c.batch_size,
            sampler=sampler,
            drop_last=True,
            collate_fn=collate_batch,
        ):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    correct = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(
            SeededFetch(val, c.seed, 0),
            batch_size=c.batch_size,
            collate_fn=collate_batch,
            sampler=DistributedSampler(val, world, rank, shuffle=False),
        ):
            correct += torch.tensor([(model.module(x).argmax(1) == y).sum(), len(y)])
    dist.all_reduce(correct)
    if rank == 0:
        os.makedirs(sys.argv[1], exist_ok=True)
        torch.save(
            {"model": model.module.state_dict(), "optimizer": opt.state_dict()},
            os.path.join(sys.argv[1], "checkpoint.pth"),
        )
        print(f"loop {time.perf_counter() - start:.3f} s, val_acc {correct[0] / correct[1]:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
