"""A third tracker, as a user would write one: one module providing ``TRACKER``.

It keeps what it is sent in this process (``POINTS``, ``RECORDS``), so a rank-side test can
check what the trainer sent, and when. Registered by name in ``refddp.training.trackers.TRACKERS``.
"""

from __future__ import annotations

from typing import Any

from refddp.training.trackers.base import Run, Tracker

POINTS: list[tuple[int, dict[str, float]]] = []  # (step, scalars) from log()
RECORDS: list[dict[str, Any]] = []  # evaluation records
EVENTS: list[str] = []  # open / log STEP / flush / close, in order


class Recording(Tracker):
    name = "recording"

    def __init__(self, run: Run):
        super().__init__(run)
        EVENTS.append(f"open at step {run.start_step}")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        POINTS.append((step, dict(scalars)))
        EVENTS.append(f"log {step}")

    def record(self, record: dict[str, Any]) -> None:
        RECORDS.append(dict(record))

    def flush(self) -> None:
        EVENTS.append("flush")

    def close(self) -> None:
        EVENTS.append("close")


def register() -> None:
    """Make ``--log-to recording`` name this module (in this process)."""
    from refddp.training import trackers

    trackers.TRACKERS["recording"] = __name__
    POINTS.clear(), RECORDS.clear(), EVENTS.clear()


TRACKER = Recording
