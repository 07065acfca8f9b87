"""nanoGPT's shape: module-level flags from torchrun's variables, used in a training script."""

import os

import torch
import torch.distributed as dist

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    ddp_rank = int(os.environ["RANK"])
    master_process = ddp_rank == 0
else:
    master_process = True


def estimate_loss(t):
    dist.all_reduce(t)
    return t


losses = torch.zeros(3)
for it in range(10):
    if it % 5 == 0 and master_process:
        losses = estimate_loss(losses)  # expect: RDL101
        torch.save({"it": it}, "ckpt.pt")
if ddp:
    dist.destroy_process_group()
