"""DDP's backward, FSDP's forward, DDP's construction and DCP on some ranks only."""

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_step(model, batch, optimizer):
    model = DDP(model)
    loss = model(batch).sum()
    if dist.get_rank() == 0:
        loss.backward()  # expect: RDL101
    optimizer.step()


def fsdp_eval(model, batch):
    model = FSDP(model)
    if dist.get_rank() == 0:
        return model(batch)  # expect: RDL101
    return None


def fsdp2_eval(model, batch):
    fully_shard(model)
    if dist.get_rank() == 0:
        model(batch)  # expect: RDL101


def wrap_on_rank0(model):
    if dist.get_rank() == 0:
        model = DDP(model)  # expect: RDL101
    return model


def save(state, path):
    if dist.get_rank() == 0:
        dcp.save(state, checkpoint_id=path)  # expect: RDL101
