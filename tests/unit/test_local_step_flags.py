"""``StepFlags.local``: the non-finite flag is about the loss, not about a float32 copy of it;
the target count survives the float32 all-reduce exactly; every stop signal has its own flag,
read back as that signal. Built on the device (CUDA, or reading late) and on the host (the CPU
reading now) alike."""

import math
import signal

import pytest
import torch

from refddp.step_flags import Alone, StepFlags, StopRequest, _decode


class _Sent:
    """Stands in for the gradient all-reduce: keeps the flags it is handed to carry."""

    flags = None

    def set_flags(self, flags: torch.Tensor) -> None:
        self.flags = flags


class _Sum:
    """Stands in for the ranks' agreement: the sum of the given ranks' flags."""

    def __init__(self, *others: torch.Tensor):
        self.others = others

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        return sum(self.others, flags)


BUILDS = pytest.mark.parametrize("on_host", [False, True], ids=["device", "host"])


@BUILDS
def test_a_large_finite_float64_loss_is_not_flagged_non_finite(on_host):
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, on_host=on_host)
    large = torch.tensor(1e300, dtype=torch.float64)  # inf once cast to float32
    sent = flags.local(large).tolist()
    assert sent[:-1] == [0.0] * (3 + len(StopRequest.SIGNALS))  # the last: the loss, for logs
    assert not _decode(sent).nonfinite
    assert torch.isnan(flags.local(torch.tensor(float("inf")))[0])


@BUILDS
def test_the_target_count_is_summed_over_ranks_exactly_beyond_float32_integers(on_host):
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, on_host=on_host)
    big = 2**24 + 1  # float32 cannot hold it: a count sent as one float32 would round
    assert float(torch.tensor(big, dtype=torch.float32)) != big
    assert float(torch.tensor(big, dtype=torch.float32) + 2) != big + 2  # nor a sum with it
    summed = flags.local(None, torch.tensor(big)) + flags.local(None, 2)  # an all-reduce's sum
    assert StepFlags.targets(summed).item() == big + 2
    assert _decode(summed.tolist()).targets == big + 2


@BUILDS
def test_each_stop_signal_is_read_back_as_itself_and_the_first_in_signals_wins(on_host):
    assert signal.SIGUSR1 in StopRequest.SIGNALS  # SLURM's signal before a time limit
    received = {}
    for sig in (None, *StopRequest.SIGNALS):
        stop = StopRequest()
        stop.signal = sig
        built = StepFlags(None, stop, torch.device("cpu"), late=False, on_host=on_host)
        received[sig] = built.local()
    for sig in StopRequest.SIGNALS:
        alone = StepFlags(_Sum(received[None]), StopRequest(), torch.device("cpu"), late=False)
        assert alone.read(received[sig])[:2] == (False, sig)
    # Rank 0 got SIGUSR1, rank 1 SIGTERM: both ranks read the same stop.
    for mine, theirs in ((signal.SIGUSR1, signal.SIGTERM), (signal.SIGTERM, signal.SIGUSR1)):
        both = StepFlags(_Sum(received[theirs]), StopRequest(), torch.device("cpu"), late=False)
        assert both.read(received[mine])[:2] == (False, signal.SIGTERM)
    assert _decode(received[None].tolist())[:2] == (False, 0)


def test_the_host_and_the_device_build_the_same_flags():
    device = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, on_host=False)
    host = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, on_host=True)
    assert host.on_host and not device.on_host
    assert StepFlags(None, StopRequest(), torch.device("cpu"), late=False).on_host  # the default
    assert not StepFlags(None, StopRequest(), torch.device("cpu"), late=True).on_host
    losses = [None, torch.tensor(2.5), torch.tensor(-1.25, dtype=torch.float64),
              torch.tensor(1 / 3, dtype=torch.bfloat16), torch.tensor(float("nan"))]  # fmt: skip
    for loss in losses:
        for count in (256, 2**24 + 3, torch.tensor(70_001)):
            for sig in (None, signal.SIGUSR1):
                host.stop.signal = device.stop.signal = sig
                built = host.local(loss, count), device.local(loss, count)
                assert built[0].dtype == built[1].dtype == torch.float32
                same = [a == b or math.isnan(a) and math.isnan(b) for a, b in
                        zip(built[0].tolist(), built[1].tolist(), strict=True)]  # fmt: skip
                assert all(same), (loss, count, sig, built)


def test_one_process_reading_now_sends_its_loss_and_exact_count_and_reads_its_own_stop():
    stop = StopRequest()
    flags = StepFlags(None, stop, torch.device("cpu"), late=False, alone=True)
    big = 2**24 + 3  # not a float32
    sent = flags.send(torch.tensor(2.5), torch.tensor(big))
    assert isinstance(sent, Alone)  # no tensor built: the loss and count as they were
    assert flags.read(sent) == (False, 0, big, 2.5)
    assert flags.read(flags.send(torch.tensor(float("inf")), 3)).nonfinite
    # A count as a Python int (a mean loss's batch size) or kept as a [1] tensor reads alike.
    for count in (big, torch.tensor([big])):
        assert flags.read(flags.send(torch.tensor([2.5]), count)) == (False, 0, big, 2.5)
    stop.signal = signal.SIGUSR1
    assert flags.read(sent).signal == signal.SIGUSR1
    # A save's flags (no loss) and a late reader's keep the full layout: the device reads them.
    full = 4 + len(StopRequest.SIGNALS)
    assert len(flags.local()) == full
    late = StepFlags(_Sent(), stop, torch.device("cpu"), late=True, alone=True)
    sent_late = late.send(torch.tensor(2.5), 3)
    assert len(sent_late) == full and late.parallel.flags is sent_late  # rides the all-reduce


def test_one_gpu_reading_now_copies_its_flags_to_the_host_when_it_sends_them():
    # On CUDA (stood in here on the CPU) the loss and a counted target count leave for the
    # host when the step sends them, before its backward is queued; read waits for that copy
    # alone. A read of the tensors instead (after the backward) would see what they hold then.
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, alone=True,
                      copy_early=True)  # fmt: skip
    big = 2**24 + 3  # not a float32
    loss, count = torch.tensor(2.5), torch.tensor([big])
    sent = flags.send(loss, count)
    loss.add_(1.0)
    count.add_(1)
    assert flags._early is not None and flags.read(sent) == (False, 0, big, 2.5)
    inf = flags.read(flags.send(torch.tensor(float("inf")), 7))  # a count known on the host
    assert inf.nonfinite and inf.targets == 7
    on_cpu = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, alone=True)
    assert on_cpu._early is None, "the CPU reads its flags where they are"


class _Rank:
    """A ``Parallel`` as far as the flags see it: this rank of a 2-rank group."""

    def __init__(self, rank: int):
        self.ctx = type("Ctx", (), {"rank": rank, "world_size": 2})()


@BUILDS
def test_the_summed_flags_carry_the_global_loss_sum_and_count(on_host):
    sent = [StepFlags(_Rank(rank), StopRequest(), torch.device("cpu"), late=False,
                      on_host=on_host).local(torch.tensor(loss), count)
            for rank, (loss, count) in enumerate([(2.5, 10), (4.0, torch.tensor(30))])]  # fmt: skip
    agreed = _decode((sent[0] + sent[1]).tolist())  # the all-reduce's sum
    assert (agreed.loss_sum, agreed.targets) == (6.5, 40)
    assert agreed.loss == 6.5 / 40  # the trackers' training loss: the mean over every target


@BUILDS
def test_counts_agreed_as_a_mean_times_the_world_size_come_back_exact(on_host):
    # DDP agrees the carried flags as a mean (each rank's times 1/3 over 3 ranks, in float32),
    # which refddp.parallel multiplies back by the world size: 6625.0005 for 6625 targets.
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False, on_host=on_host)
    counts = (2362 + 5 * 4096, 705, 3558)  # low parts whose float32 mean is off by rounding
    agreed = sum(flags.local(None, count) * (1 / 3) for count in counts) * 3
    assert agreed[2].item() != 2362 + 705 + 3558  # the mean did not land on the integer
    assert _decode(agreed.tolist()).targets == sum(counts)
    assert StepFlags.targets(agreed).item() == sum(counts)
