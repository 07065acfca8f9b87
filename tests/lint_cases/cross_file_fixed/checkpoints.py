"""Saving: a broadcast so every rank learns the path."""

import torch.distributed as dist


def agree_on_path(path):
    box = [path]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save(state, path):
    path = agree_on_path(path)
    with open(path, "w") as f:
        f.write(str(state))
