"""Rank flags behind properties, used as they should be: the collective outside the branch."""

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

    def first(self):
        return self.r == 0


class Trainer:
    def __init__(self):
        self.ctx = Context()
        self.saved = 0

    def save(self, t):
        dist.all_reduce(t)
        if self.ctx.main:
            self.saved += 1
        if self.ctx.several:
            dist.barrier()

    def log(self):
        ctx = Context()
        dist.barrier()
        if ctx.leader:
            print("logged")

    def hooked(self, t):
        hook = self.ctx.first  # a method read, not called: a bound method, true on every rank
        if hook:
            dist.all_reduce(t)
