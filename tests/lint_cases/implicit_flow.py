"""A value set on rank 0 only is rank-dependent too: branching on it splits the ranks."""

import torch
import torch.distributed as dist


def load_on_rank0(path):
    state = None
    if dist.get_rank() == 0:
        state = torch.load(path)
    if state is not None:
        dist.broadcast_object_list([state], src=0)  # expect: RDL101
