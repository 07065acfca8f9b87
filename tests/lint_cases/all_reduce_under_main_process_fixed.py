"""Every rank all-reduces; only the main process prints."""

import torch.distributed as dist


def is_main_process():
    return dist.get_rank() == 0


def log_loss(loss):
    dist.all_reduce(loss)
    if is_main_process():
        print(loss.item())


class Logger:
    def __init__(self):
        self.is_main = dist.get_rank() == 0

    def log(self, loss):
        dist.all_reduce(loss)
        if self.is_main:
            print(loss.item())


def on_leader():
    return dist.get_rank() == 0


def log_on_leader(loss):
    dist.all_reduce(loss)
    if on_leader():
        print(loss.item())


class Reporter:
    def __init__(self):
        self.leader = dist.get_rank() == 0

    def report(self, loss):
        dist.barrier()
        if self.leader:
            print(loss)
