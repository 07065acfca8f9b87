"""The same job as plain_ddp_loop.py, written the way HF Accelerate's docs teach it: a peer for
trainer_overhead.py. ``accelerator.prepare`` shards the loader (each process takes every
world-th batch of ``GLOBAL_BATCH / world``) and wraps the model in DDP.

    python benchmarks/accelerate_loop.py --model demo --out DIR                 # 1 process
    torchrun --standalone --nproc-per-node 2 benchmarks/accelerate_loop.py --model demo --out DIR
"""

import os
import sys

import torch
from accelerate import Accelerator, DataLoaderConfiguration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_job import WEIGHT_DECAY, EpochClock, Job, checkpoint_path, end, parse_args, report  # noqa: E402, I001


def main() -> None:
    args = parse_args()
    job = Job(args.model)
    cuda = args.device == "cuda"
    # On CUDA pinned batches copied with non_blocking, as the other two loops copy them
    accelerator = Accelerator(cpu=not cuda,
                              dataloader_config=DataLoaderConfiguration(non_blocking=cuda))  # fmt: skip
    world = accelerator.num_processes
    model, train, val = job.build()
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=WEIGHT_DECAY,
                            fused=cuda or None)  # fmt: skip
    loader = job.loader(train, job.global_batch // world, args.device, shuffle=True,
                        drop_last=True, generator=torch.Generator().manual_seed(0))  # fmt: skip
    val_loader = job.loader(val, job.global_batch, args.device)
    model, opt, loader, val_loader = accelerator.prepare(model, opt, loader, val_loader)
    clock = EpochClock()
    for epoch in range(job.epochs):
        loader.set_epoch(epoch)
        clock.start()
        units = 0
        for batch in loader:
            units += job.units(batch) * world
            opt.zero_grad(set_to_none=True)
            accelerator.backward(job.loss(model, batch))
            opt.step()
        if cuda:
            torch.cuda.synchronize()  # the epoch's kernels done, as refddp's window reads them
        clock.stop(units)
        total = count = 0.0
        model.eval()
        with torch.no_grad():
            for batch in val_loader:
                score = accelerator.gather_for_metrics(
                    torch.tensor([job.score(model, batch)], dtype=torch.float64,
                                 device=accelerator.device))  # fmt: skip
                total, count = total + float(score[:, 0].sum()), count + float(score[:, 1].sum())
        model.train()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            state = {"model": accelerator.unwrap_model(model).state_dict(),
                     "optimizer": opt.state_dict(), "epoch": epoch}  # fmt: skip
            torch.save(state, checkpoint_path(args.out))
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        report(clock, total / count)
    accelerator.end_training()
    end()


if __name__ == "__main__":
    main()
