"""Every rank runs forward and backward; under no_sync the backward does not communicate."""

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_step(model, batch, optimizer):
    model = DDP(model)
    loss = model(batch).sum()
    loss.backward()
    optimizer.step()


def accumulate(model, batch):
    model = DDP(model)
    loss = model(batch).sum()
    if dist.get_rank() == 0:
        with model.no_sync():
            loss.backward()  # no all-reduce under no_sync


def save(model, state, path):
    dcp.save(state, checkpoint_id=path)
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path + ".pt")
