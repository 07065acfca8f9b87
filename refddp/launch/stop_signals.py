"""Stop requests: the signals that end a run at a step boundary with a checkpoint.

SIGTERM (torchrun's agent, a scheduler), SIGINT (Ctrl-C) and SIGUSR1 (SLURM's warning before a
time limit, ``--signal=USR1@SECONDS``) only set a flag here; the trainer's ranks agree on it where
they next meet (``refddp/training/step_agreement.py``) and stop together. Loader workers ignore
the same signals (``refddp/workload/data.py``): their rank shuts them down.
"""

from __future__ import annotations

import signal
from typing import Any


class StopRequest:
    """SIGTERM/SIGINT/SIGUSR1 set a flag; ranks agree on it where they next meet (the step's
    agreement where a step meets, at least every ``--stop-check-s``; the settle before an
    evaluation or a save, the end of a save) and stop together with a
    checkpoint. Where ranks received different signals, the first in ``SIGNALS`` names the
    stop (on every rank alike)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signal = signum
