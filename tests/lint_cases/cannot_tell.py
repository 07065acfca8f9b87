"""Calls the lint cannot see into, under rank conditions: notes, never guesses."""

import logging
import os

import torch.distributed as dist

log = logging.getLogger(__name__)


def on_rank0(obj, name, callback, hooks):
    if dist.get_rank() == 0:
        callback()  # expect: RDL201
        getattr(obj, name)()  # expect: RDL201
        hooks[name]()  # expect: RDL201
        obj.refresh_remote_state()  # expect: RDL201
        log.info("done")
        print(os.path.join("a", name).upper())


def on_subgroup(t, group, members):
    if dist.get_rank() in members:  # a subgroup's collective is for its members alone
        dist.all_reduce(t, group=group)  # expect: RDL201
