"""The trainer: rank 0 saves, as a DistContext says."""

from .checkpoints import save


class Trainer:
    def __init__(self, ctx):
        self.ctx = ctx
        self.rank = ctx.rank

    def end_of_epoch(self, state):
        if self.ctx.is_main:
            save(state, "ckpt.txt")  # expect: RDL101

    def end_of_step(self, state, step):
        if self.rank == 0 and step % 100 == 0:
            self.checkpoint(state)  # expect: RDL101

    def checkpoint(self, state):
        save(state, "step.txt")
