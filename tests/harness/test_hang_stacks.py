"""A hang report shows every rank's stack, or says in one line why a rank's could not be read.

Planted here: the case a newcomer's `make test` hit (a rank inside refddp's trainer, whose stop
handlers take SIGTERM, SIGINT and SIGUSR1, answered the driver's stack request with nothing),
a task that takes the harness's stack signal and puts the default back (the next hang's
request would then kill the rank), and a rank that ignores the signal outright.
"""

import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from refddp.launch.stop_signals import StopRequest
from refddp.testing import RankTimeout
from refddp.testing.driver.reports import why_no_stack
from refddp.testing.protocol import STACK_SIGNAL

DEADLINE = 3  # both ranks blocked for good: only the deadline ends these tests


def blocked_against_each_other():
    # No rank finishes, so the harness waits for the deadline, then asks every rank's stack:
    # each waits for a message from any source (which the check cannot pair with a send).
    dist.recv(torch.zeros(1))


def blocked_inside_the_trainers_stop_handlers():
    with StopRequest() as stop:  # what Trainer.fit runs inside
        blocked_against_each_other()
    return stop.signal


def take_the_stack_signal_and_put_the_default_back():
    signal.signal(STACK_SIGNAL, lambda *_: None)
    signal.signal(STACK_SIGNAL, signal.SIG_DFL)  # what Python had recorded for it


def blocked_ignoring_the_stack_signal():
    signal.signal(STACK_SIGNAL, signal.SIG_IGN)
    blocked_against_each_other()


def assert_every_stack_shown(report: RankTimeout, frame: str) -> None:
    assert set(report.failures) == {0, 1}
    for rank, text in report.failures.items():
        assert "no stack" not in text, f"rank {rank}: {text}"
        assert f"in {frame}" in text, f"rank {rank}'s stack must show the test's frame"
        assert "Current thread" in text, "every thread is dumped"


def test_a_rank_inside_the_trainers_stop_handlers_shows_its_stack(spawn):
    with pytest.raises(RankTimeout) as info:
        spawn(blocked_inside_the_trainers_stop_handlers, timeout=DEADLINE)
    assert_every_stack_shown(info.value, "blocked_against_each_other")
    assert "in blocked_inside_the_trainers_stop_handlers" in info.value.failures[0]


def test_a_task_that_took_the_stack_signal_leaves_the_next_hang_its_stacks(spawn):
    spawn(take_the_stack_signal_and_put_the_default_back)
    with pytest.raises(RankTimeout) as info:
        spawn(blocked_against_each_other, timeout=DEADLINE)
    assert_every_stack_shown(info.value, "blocked_against_each_other")
    assert "killed by signal" not in str(info.value)


def test_a_rank_ignoring_the_stack_signal_is_reported_saying_why(spawn):
    started = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        spawn(blocked_ignoring_the_stack_signal, timeout=DEADLINE)
    assert set(info.value.failures) == {0, 1}
    for text in info.value.failures.values():
        assert f"(no stack: it ignores signal {int(STACK_SIGNAL)}, the harness's stack request" in text
    assert time.monotonic() - started < DEADLINE + 30, "the report does not wait for long"


def sleeping_process(setup: str) -> subprocess.Popen:
    code = f"import signal, sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.parametrize(
    ("setup", "stop", "expected"),
    [
        (f"signal.signal({int(STACK_SIGNAL)}, signal.SIG_IGN)", False, "it ignores signal"),
        (f"signal.pthread_sigmask(signal.SIG_BLOCK, [{int(STACK_SIGNAL)}])", False,
         "every thread of it blocks signal"),
        ("", False, "its handler for signal"),  # nothing catches it: the default action
        (f"signal.signal({int(STACK_SIGNAL)}, lambda *_: None)", True, "it is stopped"),
        (f"signal.signal({int(STACK_SIGNAL)}, lambda *_: None)", False, "did not answer within"),
    ],
    ids=["ignored", "blocked", "no-handler", "stopped", "slow-or-taken"],
)
def test_why_a_rank_wrote_no_stack_is_read_from_the_kernel(setup, stop, expected):
    proc = sleeping_process(setup)
    try:
        if stop:
            proc.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while "T" not in state_of(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.01)  # (the kernel stops it asynchronously)
        assert expected in why_no_stack(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert "exited" in why_no_stack(proc.pid)
