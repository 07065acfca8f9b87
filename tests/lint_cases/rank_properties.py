"""Rank flags behind properties of the project's own classes, named like nothing the lint
knows (``main``, ``leader``): what the getter returns decides."""

import functools

import torch.distributed as dist


class Context:
    def __init__(self):
        self.r = dist.get_rank()
        self.world = dist.get_world_size()

    @property
    def main(self):
        return self.r == 0

    @functools.cached_property
    def leader(self):
        return dist.get_rank() == 0

    @property
    def several(self):
        return self.world > 1


class Trainer:
    def __init__(self):
        self.ctx = Context()

    def save(self, t):
        if self.ctx.main:
            dist.all_reduce(t)  # expect: RDL101
        if self.ctx.several:
            dist.barrier()

    def log(self):
        ctx = Context()
        if ctx.leader:
            dist.barrier()  # expect: RDL101


class Base:
    def save(self, t):
        if self.leader:  # a subclass's property decides
            dist.all_reduce(t)  # expect: RDL101


class Worker(Base):
    @property
    def leader(self):
        return dist.get_rank() == 0


class Settable:
    def __init__(self):
        self._chief = dist.get_rank() == 0

    @property
    def chief(self):
        return self._chief

    @chief.setter
    def chief(self, value):
        self._chief = bool(value)
        if self._chief:
            dist.barrier()  # expect: RDL101

    def save(self, t):
        if self.chief:
            dist.all_reduce(t)  # expect: RDL101
