"""The ceiling for trainer_overhead.py: the DDP loop people write by hand, doing the same job as
``refddp.train`` (overhead_job.py: same model, data and batched data path, global batch,
optimizer; each epoch trains, evaluates and saves a checkpoint on rank 0).

    python benchmarks/plain_ddp_loop.py --model demo --out DIR [--device cuda]  # 1 process
    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp_loop.py --model demo --out DIR

Prints one JSON line: steady-state training samples/s, or target tokens/s for GPT-2
(overhead_job.EpochClock), and the validation score. One process trains the bare model (no
DDP), the fastest loop there is.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_job import WEIGHT_DECAY, EpochClock, Job, checkpoint_path, end, parse_args, report  # noqa: E402, I001


def main() -> None:
    args = parse_args()
    job = Job(args.model)
    distributed, cuda = "WORLD_SIZE" in os.environ, args.device == "cuda"
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    model, train, val = job.build()
    model = model.to(device)
    if distributed:
        model = DDP(model, device_ids=[device] if cuda else None)
    bare = model.module if distributed else model
    # On CUDA the fused AdamW (one kernel per step), the fastest torch has there
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=WEIGHT_DECAY,
                            fused=cuda or None)  # fmt: skip
    sampler = DistributedSampler(train, world, rank, seed=0, drop_last=True)
    loader = job.loader(train, job.global_batch // world, args.device, sampler=sampler,
                        drop_last=True)  # fmt: skip
    val_loader = job.loader(val, job.global_batch, args.device,
                            sampler=DistributedSampler(val, world, rank, shuffle=False))  # fmt: skip
    clock = EpochClock()
    for epoch in range(job.epochs):
        sampler.set_epoch(epoch)
        clock.start()
        units = 0
        for batch in loader:
            units += job.units(batch) * world
            batch = job.to(batch, device)
            opt.zero_grad(set_to_none=True)
            job.loss(model, batch).backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize()  # the epoch's kernels done, as refddp's window reads them
        clock.stop(units)
        score = torch.zeros(2, dtype=torch.float64)
        bare.eval()
        with torch.no_grad():
            for batch in val_loader:
                score += torch.tensor(job.score(bare, job.to(batch, device)), dtype=torch.float64)
        score = score.to(device)
        bare.train()
        if distributed:
            dist.all_reduce(score)
        if rank == 0:
            state = {"model": bare.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            torch.save(state, checkpoint_path(args.out))
        if distributed:
            dist.barrier()
    if rank == 0:
        report(clock, float(score[0] / score[1]))
    if distributed:
        dist.destroy_process_group()
    end()


if __name__ == "__main__":
    main()
