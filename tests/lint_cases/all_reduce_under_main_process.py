"""An all_reduce inside `if is_main_process():`, through a helper and a stored flag."""

import torch.distributed as dist


def is_main_process():
    return dist.get_rank() == 0


def log_loss(loss):
    if is_main_process():
        dist.all_reduce(loss)  # expect: RDL101
        print(loss.item())


class Logger:
    def __init__(self):
        self.is_main = dist.get_rank() == 0

    def log(self, loss):
        if self.is_main:
            dist.all_reduce(loss)  # expect: RDL101


def on_leader():  # not named like a rank: its return value says it is one
    return dist.get_rank() == 0


def log_on_leader(loss):
    if on_leader():
        dist.all_reduce(loss)  # expect: RDL101


class Reporter:
    def __init__(self):
        self.leader = dist.get_rank() == 0

    def report(self, loss):
        if self.leader:
            dist.barrier()  # expect: RDL101
