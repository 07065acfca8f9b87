"""The same job as plain_ddp_loop.py, written the way HF Accelerate's docs teach it: a peer for
trainer_overhead.py. ``accelerator.prepare`` shards the loader (each process takes every
world-th batch of ``GLOBAL_BATCH / world``) and wraps the model in DDP.

    python benchmarks/accelerate_loop.py --model demo --out DIR                 # 1 process
    torchrun --standalone --nproc-per-node 2 benchmarks/accelerate_loop.py --model demo --out DIR
"""

import os
import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_job import GLOBAL_BATCH, LR, WEIGHT_DECAY, EpochClock, Job, TensorBatches, checkpoint_path, first, parse_args, report  # noqa: E402, I001


def main() -> None:
    args = parse_args()
    job = Job(args.model)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    world = accelerator.num_processes
    model, x, y, val_x, val_y = job.build()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    loader = DataLoader(TensorBatches(x, y), GLOBAL_BATCH // world, shuffle=True, drop_last=True,
                        collate_fn=first, generator=torch.Generator().manual_seed(0))  # fmt: skip
    val_loader = DataLoader(TensorBatches(val_x, val_y), GLOBAL_BATCH, collate_fn=first)
    model, opt, loader, val_loader = accelerator.prepare(model, opt, loader, val_loader)
    clock = EpochClock()
    for epoch in range(job.epochs):
        loader.set_epoch(epoch)
        clock.start()
        samples = 0
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            accelerator.backward(F.cross_entropy(model(xb), yb))
            opt.step()
            samples += len(xb) * world
        clock.stop(samples)
        correct = total = 0
        model.eval()
        with torch.no_grad():
            for xb, yb in val_loader:
                hits = accelerator.gather_for_metrics(model(xb).argmax(1) == yb)
                correct, total = correct + int(hits.sum()), total + len(hits)
        model.train()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            state = {"model": accelerator.unwrap_model(model).state_dict(),
                     "optimizer": opt.state_dict(), "epoch": epoch}  # fmt: skip
            torch.save(state, checkpoint_path(args.out))
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        report(clock, correct / total)
    accelerator.end_training()


if __name__ == "__main__":
    main()
