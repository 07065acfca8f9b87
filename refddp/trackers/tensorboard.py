"""``--log-to tensorboard``: event files in ``OUT/tensorboard/`` (``torch.utils.tensorboard``).

One directory for the whole run, whatever its invocations: ``tensorboard --logdir OUT``
shows one set of curves. A resumed invocation opens its writer with ``purge_step`` = the
first step it runs: TensorBoard then hides what a killed invocation logged at or after that
step (written after its last checkpoint, and logged again by the resumed run), so the curves
continue without duplicate or missing points.

A logged step is one event with all its scalars, and the tracker hands the writer its events
in batches (``PENDING`` logged steps, or at an evaluation, a checkpoint's flush and the end):
the writer's thread, which checksums every record in Python, then takes the GIL from the
training loop once a batch instead of once a scalar (``benchmarks/README.md``, trainer
overhead with the tracker on). The writer flushes to disk every 120 s on its own; a batch
waits at most ``PENDING`` logged steps or ``PENDING_S`` seconds on top, and never past a
checkpoint.
"""

from __future__ import annotations

import os
import time
from typing import Any

from refddp.run_files import writing
from refddp.trackers.base import Run, Tracker, missing_extra, record_scalars

PENDING = 10  # logged steps held before the writer gets them
PENDING_S = 5.0  # ... or seconds since the first of them


class TensorBoard(Tracker):
    name = "tensorboard"

    @classmethod
    def check_installed(cls) -> None:
        _summary_writer()

    def __init__(self, run: Run):
        super().__init__(run)
        SummaryWriter = _summary_writer()
        self.directory = os.path.join(run.out, "tensorboard")
        purge_step = run.start_step + 1 if run.resumed else None
        with writing(self.directory):
            self.writer = SummaryWriter(self.directory, purge_step=purge_step)
        self.pending: list[tuple[int, dict[str, float], float]] = []  # (step, scalars, time)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = time.time()  # the event's wall time: when it was logged, not written
        self.pending.append((step, scalars, now))
        if len(self.pending) >= PENDING or now - self.pending[0][2] >= PENDING_S:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the writer the pending steps, one event each (all of a step's scalars)."""
        Summary = _summary_proto()
        events = self.writer.file_writer
        for step, scalars, wall_time in self.pending:
            values = [Summary.Value(tag=tag, simple_value=float(value))
                      for tag, value in scalars.items()]  # fmt: skip
            events.add_summary(Summary(value=values), step, wall_time)
        self.pending.clear()

    def record(self, record: dict[str, Any]) -> None:
        self.log(record["step"], record_scalars(record))
        self.flush()  # an evaluation is worth seeing now, not at the writer's next flush

    def flush(self) -> None:
        self.hand_over()
        with writing(self.directory):
            self.writer.flush()

    def close(self) -> None:
        self.hand_over()
        with writing(self.directory):
            self.writer.close()


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise missing_extra("tensorboard", "tensorboard") from None
    return SummaryWriter


def _summary_proto() -> Any:
    """TensorBoard's ``Summary`` protocol buffer (``torch.utils.tensorboard`` builds its
    scalars with it too)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary


TRACKER = TensorBoard
