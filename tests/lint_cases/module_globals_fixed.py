"""Every rank evaluates; the master process alone saves."""

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
    if it % 5 == 0:
        losses = estimate_loss(losses)
        if master_process:
            torch.save({"it": it}, "ckpt.pt")
if ddp:
    dist.destroy_process_group()
