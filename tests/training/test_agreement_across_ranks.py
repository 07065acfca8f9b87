"""``StepAgreement`` across ranks: what each rank sends comes back summed on every rank, the
target count exact past float32's integers, the loss sum, and one stop signal named alike
where ranks received different ones; ranks whose steps take different times meet on the same
steps (``refddp/training/step_agreement.py``)."""

import signal
import time

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refddp.launch.stop_signals import StopRequest
from refddp.training.step_agreement import StepAgreement

BIG = 2**24 + 1  # float32 would round it to 2**24


def agree_once() -> tuple:
    stop = StopRequest()
    rank = dist.get_rank()
    stop.signal = (signal.SIGUSR1, None, signal.SIGTERM)[rank]
    agreement = StepAgreement(stop, torch.device("cpu"), dist.get_world_size(), stop_check_s=0)
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


def steps_at_own_pace(paces: list[list[float]], signalled_after: int) -> tuple:
    """Steps of a per-sample loss (the count known, nothing to log) with a stop check every
    20 ms, each step sleeping this rank's own ``paces`` (seconds): the steps that met and the
    signal each step read. Rank 0 receives SIGUSR1 after step ``signalled_after``. After each
    step the ranks compare whether it met, in a gather of their own: a rank that met alone
    would pair its all-reduce with the others' gather, which the harness names at once."""
    stop = StopRequest()
    rank, world = dist.get_rank(), dist.get_world_size()
    agreement = StepAgreement(stop, torch.device("cpu"), world, 0.02)
    met, signals = [], []
    for step, pace in enumerate(paces[rank], start=1):
        agreement.send(4, None, known_total=4 * world)
        time.sleep(pace)
        read = agreement.read(torch.tensor(1.0))
        everyones = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(everyones, torch.tensor([float(agreement.step_met)]))
        assert len({float(m) for m in everyones}) == 1, f"step {step}: met on some ranks only"
        met += [step] if agreement.step_met else []
        signals.append(read.signal)
        if rank == 0 and step == signalled_after:
            stop.signal = signal.SIGUSR1
    return met, signals


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(paces=st.lists(st.lists(st.sampled_from([0.0, 0.001, 0.004, 0.015]), min_size=30,
                               max_size=30), min_size=3, max_size=3),
       signalled_after=st.integers(1, 20))  # fmt: skip
def test_ranks_at_different_paces_meet_on_the_same_steps_and_read_a_signal_together(
    spawn, paces, signalled_after
):
    found = spawn(steps_at_own_pace, paces, signalled_after, world_size=3, timeout=20)
    assert len(set(map(repr, found))) == 1, "every rank met on the same steps, read alike"
    met, signals = found[0]
    assert met[0] == 1, "the first step meets"
    stops = [step for step, signum in enumerate(signals, start=1) if signum]
    later = [step for step in met if step > signalled_after]
    assert stops == later, "read at every meeting after the signal, at no other step"
