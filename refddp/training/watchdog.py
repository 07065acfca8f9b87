"""The hang watchdog: a rank that makes no progress for ``timeout`` seconds dumps every
thread's stack to a file and exits, so a hang anywhere fails the job with the evidence."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import threading
import time
from typing import IO


class HangWatchdog:
    """Dump every thread's stack to ``path`` and exit if no progress is made for ``timeout_s``.

    ``progress()`` marks progress; the trainer calls it each step, eval batch and checkpoint. A
    rank stuck in a data loader or in a collective its peers never reach thus leaves its stack
    behind and fails the job instead of blocking it forever.

    The timer is faulthandler's: a C thread that dumps and exits even while the main thread is
    blocked in native code. Re-arming it joins one thread and starts another (0.05-2.5 ms on 2
    busy cores: more than a small model's whole step costs), so ``progress()`` only notes the
    time and a helper thread re-arms the timer every ``period_s`` if there was progress since,
    for the last progress + ``timeout_s`` + ``period_s``. So it fires only after ``timeout_s``
    without progress, at most ``period_s`` later than that; and, as when every step re-armed
    it, each rank's deadline follows its own last progress: ranks blocked at the same step
    dump together (one that dumped and exited long before the others would cut them off, by
    failing the job, before their stacks were written).
    """

    EXIT_CODE = 1  # faulthandler's exit=True exits with status 1

    def __init__(self, path: str, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self.period_s = timeout_s / 8
        self._file: IO[str] | None = None
        self._last = self._armed_for = time.monotonic()
        self._stop = threading.Event()
        self._helper: threading.Thread | None = None

    def __enter__(self) -> HangWatchdog:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "w")  # noqa: SIM115 - faulthandler needs it open
        self.progress()
        self._arm(self._last)
        self._helper = threading.Thread(target=self._rearm_while_open, name="refddp-watchdog",
                                        daemon=True)  # fmt: skip
        self._helper.start()
        return self

    def progress(self) -> None:
        self._last = time.monotonic()  # all the main thread pays per step

    def rearm_if_progressed(self) -> None:
        """(The helper thread's check, every ``period_s``.)"""
        last = self._last
        if last != self._armed_for:
            self._arm(last)

    def _arm(self, last: float) -> None:
        remaining = last + self.timeout_s + self.period_s - time.monotonic()
        faulthandler.dump_traceback_later(max(remaining, 1e-3), file=self._file, exit=True)
        self._armed_for = last

    def _rearm_while_open(self) -> None:
        while not self._stop.wait(self.period_s):
            self.rearm_if_progressed()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._helper is not None:
            self._helper.join()  # it re-arms no more
            self._helper = None
        faulthandler.cancel_dump_traceback_later()
        if self._file is not None:
            empty = self._file.tell() == 0
            self._file.close()
            self._file = None
            if empty:
                os.remove(self.path)
                with contextlib.suppress(OSError):  # another rank may still have its file
                    os.rmdir(os.path.dirname(self.path))
