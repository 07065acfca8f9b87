"""``StepAgreement`` across ranks: what each rank sends comes back summed on every rank, the
target count exact past float32's integers, the loss sum, and one stop signal named alike
where ranks received different ones (``refddp/training/step_agreement.py``)."""

import signal

import torch
import torch.distributed as dist

from refddp.launch.stop_signals import StopRequest
from refddp.training.step_agreement import StepAgreement

BIG = 2**24 + 1  # float32 would round it to 2**24


def agree_once() -> tuple:
    stop = StopRequest()
    rank = dist.get_rank()
    stop.signal = (signal.SIGUSR1, None, signal.SIGTERM)[rank]
    agreement = StepAgreement(stop, torch.device("cpu"), dist.get_world_size())
    agreement.send(BIG, torch.tensor(0.5 * (rank + 1)))
    count = agreement.targets().item()
    return count, tuple(agreement.read(torch.tensor(2.0)))


def test_the_agreement_sums_every_ranks_count_loss_and_stop_signal(spawn):
    found = spawn(agree_once, world_size=3)
    assert len(set(found)) == 1, "every rank reads the same"
    count, (targets, loss_sum, signum, norm) = found[0]
    assert count == targets == 3 * BIG, "exact past 2**24"
    assert loss_sum == 3.0 and norm == 2.0
    # SIGTERM before SIGUSR1 in StopRequest.SIGNALS: every rank names SIGTERM.
    assert signum == signal.SIGTERM
