"""``StepAgreement``, one rank's side of the per-step all-reduce, and ``decode`` of its sums
(one process here: what it sends is what it reads; several ranks: test_agreement_across_ranks.py)."""

import math
import signal

import torch

from refddp.launch.stop_signals import StopRequest
from refddp.training.step_agreement import StepAgreement, decode


def test_one_process_reads_back_its_count_last_loss_and_stop_signal():
    stop = StopRequest()
    agreement = StepAgreement(stop, torch.device("cpu"), world_size=1)
    agreement.send(7, None)
    assert agreement.targets().dtype == torch.float64 and agreement.targets().item() == 7
    assert agreement.read() == (7.0, 0.0, 0, agreement.read().grad_norm)
    assert math.isnan(agreement.read().grad_norm), "no norm read with it"
    stop.signal = signal.SIGUSR1
    agreement.send(0, torch.tensor(2.5, dtype=torch.float32))
    read = agreement.read(torch.tensor(3.0))
    assert read == (0.0, 2.5, signal.SIGUSR1, 3.0)


def test_a_count_past_float32s_integers_comes_back_exact():
    agreement = StepAgreement(StopRequest(), torch.device("cpu"), world_size=1)
    big = 2**24 + 1  # float32 would round it to 2**24
    agreement.send(big, None)
    assert agreement.read().targets == big


def test_each_stop_signal_is_read_back_as_itself_and_the_first_in_signals_wins():
    assert signal.SIGUSR1 in StopRequest.SIGNALS  # SLURM's signal before a time limit
    for index, sig in enumerate(StopRequest.SIGNALS):
        flags = [0.0] * len(StopRequest.SIGNALS)
        flags[index] = 1.0
        assert decode([3.0, 1.0, *flags]).signal == sig
    # Summed over ranks that received different signals: every rank names the same one.
    assert decode([3.0, 1.0, *[1.0] * len(StopRequest.SIGNALS)]).signal == StopRequest.SIGNALS[0]
    assert decode([3.0, 1.0, 0.0, 2.0, 1.0]).signal == StopRequest.SIGNALS[1]
    assert decode([3.0, 1.0, 0.0, 0.0, 0.0]).signal == 0
