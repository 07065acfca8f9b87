"""``StepAgreement``, one rank's side of the per-step all-reduce, and ``decode`` of its sums
(one process here: what it sends is what it reads; several ranks: test_agreement_across_ranks.py)."""

import math
import signal

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refddp.launch.stop_signals import StopRequest
from refddp.training.step_agreement import StepAgreement, StopCheck, decode


def test_one_process_reads_back_its_count_last_loss_and_stop_signal():
    stop = StopRequest()
    agreement = StepAgreement(stop, torch.device("cpu"), world_size=1, stop_check_s=0)
    agreement.send(7, None)
    assert agreement.targets().dtype == torch.float64 and agreement.targets().item() == 7
    assert agreement.read() == (7.0, 0.0, 0, agreement.read().grad_norm)
    assert math.isnan(agreement.read().grad_norm), "no norm read with it"
    stop.signal = signal.SIGUSR1
    agreement.send(0, torch.tensor(2.5, dtype=torch.float32))
    read = agreement.read(torch.tensor(3.0))
    assert read == (0.0, 2.5, signal.SIGUSR1, 3.0)


def test_a_count_past_float32s_integers_comes_back_exact():
    agreement = StepAgreement(StopRequest(), torch.device("cpu"), world_size=1, stop_check_s=0)
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


@settings(max_examples=200, deadline=None)
@given(world=st.integers(1, 1024), step_us=st.integers(1, 10**8),
       every_s=st.sampled_from([0.0, 1e-4, 0.05, 0.1, 60.0, 1e303])  # (1e303 s overflowed)
       | st.floats(0, 1e308))  # fmt: skip
def test_the_stop_check_meets_once_every_stop_check_s_of_training(world, step_us, every_s):
    check = StopCheck(every_s)
    check.elapsed_us(at_a_step=True)  # the first step meets
    check.elapsed_us(at_a_step=True)  # and the second, whose vote covers the first: step_us a rank
    check.next_interval(float(world * step_us), world)
    assert 1 <= check.every <= StopCheck.MAX_STEPS
    interval_s = check.every * step_us / 1e6
    if check.every > 1:
        assert interval_s <= every_s, "no longer apart than stop_check_s"
    if check.every < StopCheck.MAX_STEPS:
        assert interval_s + step_us / 1e6 > every_s, "and no closer than a step short of it"
    # The steps after the meeting's: the every-th after it meets, none before.
    meets = [not check.skip_this_step() for _ in range(check.every)]
    assert meets == [False] * (check.every - 1) + [True]
