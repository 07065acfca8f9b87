"""The hang watchdog keeps off the step's path: a step only notes the time; a helper thread
re-arms faulthandler's timer for the last progress. (Its firing is test_faults.py's.)"""

from __future__ import annotations

import faulthandler
import threading

from refddp.training.watchdog import HangWatchdog


def test_steps_never_touch_the_timer_and_the_helper_rearms_it_for_the_last_progress(
    tmp_path, monkeypatch
):
    armed: list[float] = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later",
                        lambda timeout, file, exit: armed.append(timeout))  # fmt: skip
    monkeypatch.setattr(faulthandler, "cancel_dump_traceback_later", lambda: None)
    timeout = 800.0  # a 100 s period: the helper thread does not wake during this test
    with HangWatchdog(str(tmp_path / "stacks" / "rank0.txt"), timeout) as watchdog:
        # Armed on entry for: now + timeout + period (never sooner than the timeout).
        assert len(armed) == 1 and timeout < armed[0] <= timeout + watchdog.period_s
        for _ in range(100):
            watchdog.progress()
        assert len(armed) == 1
        watchdog.rearm_if_progressed()  # what the helper does every period
        assert len(armed) == 2 and timeout < armed[1] <= timeout + watchdog.period_s
        watchdog.rearm_if_progressed()
        assert len(armed) == 2, "no progress since: the deadline must stay where it was"
    assert not (tmp_path / "stacks").exists(), "nothing was dumped: the empty file goes"


def test_the_helper_thread_rearms_after_progress(tmp_path, monkeypatch):
    rearmed = threading.Event()
    calls: list[float] = []

    def record(timeout, file, exit):
        calls.append(timeout)
        if len(calls) > 1:
            rearmed.set()

    monkeypatch.setattr(faulthandler, "dump_traceback_later", record)
    monkeypatch.setattr(faulthandler, "cancel_dump_traceback_later", lambda: None)
    with HangWatchdog(str(tmp_path / "stacks" / "rank0.txt"), 0.08) as watchdog:
        watchdog.progress()
        assert rearmed.wait(timeout=60), "the helper never re-armed the timer"
