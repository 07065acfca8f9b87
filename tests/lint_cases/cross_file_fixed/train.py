"""The trainer: every rank saves (the save agrees on its path), rank 0 prints."""

from .checkpoints import save


class Trainer:
    def __init__(self, ctx):
        self.ctx = ctx
        self.rank = ctx.rank

    def end_of_epoch(self, state):
        save(state, "ckpt.txt")
        if self.ctx.is_main:
            print("saved")

    def end_of_step(self, state, step):
        if step % 100 == 0:
            self.checkpoint(state)

    def checkpoint(self, state):
        save(state, "step.txt")
