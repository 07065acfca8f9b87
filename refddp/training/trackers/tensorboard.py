"""``--log-to tensorboard``: event files in ``OUT/tensorboard/`` (``torch.utils.tensorboard``).

One directory for the whole run, whatever its invocations: ``tensorboard --logdir OUT``
shows one set of curves. An invocation opens its writer with ``purge_step`` = the first step
it runs: TensorBoard then hides what earlier invocations logged at or after that step. For a
resumed run, that is what a killed invocation logged after its last checkpoint, and the
resumed run logs again, so the curves continue without duplicate or missing points; for a
run that starts afresh in a used directory (``--resume never``), the earlier run's points.

A logged step is one event with all its scalars, and the tracker hands the writer its events
in batches: when ``PENDING`` logged steps are held, when a step is logged ``PENDING_S``
seconds or more after the last hand-over (so where steps are logged that far apart, each goes
at once), at an evaluation, before a checkpoint and at the end. The writer's thread, which
checksums every record in pure Python and appends it to the file, then wakes for a burst of
events instead of in the middle of every logged step's work, and takes the GIL from the
training loop that much less (``benchmarks/README.md``: +31-39 µs a step at the demo's size
before, +2-4 µs after). The price: a process that dies between hand-overs loses the steps it
held, up to ``PENDING`` after its last checkpoint, which the resumed run logs again.
"""

from __future__ import annotations

import os
import time
from typing import Any

from refddp.checkpoints.run_files import writing
from refddp.training.trackers.base import Run, Tracker, missing_extra, record_scalars

PENDING = 10  # logged steps held before the writer gets them
PENDING_S = 5.0  # ... or seconds since the last hand-over, at the next step logged


class TensorBoard(Tracker):
    name = "tensorboard"

    @classmethod
    def check_installed(cls) -> None:
        _summary_writer()

    def __init__(self, run: Run):
        super().__init__(run)
        SummaryWriter = _summary_writer()
        self.directory = os.path.join(run.out, "tensorboard")
        purge_step = run.start_step + 1  # (logged steps count from 1)
        with writing(self.directory):
            self.writer = SummaryWriter(self.directory, purge_step=purge_step)
        self.pending: list[tuple[int, dict[str, float], float]] = []  # (step, scalars, time)
        self.handed_at = time.time()

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = time.time()  # the event's wall time: when it was logged, not written
        self.pending.append((step, {tag: float(v) for tag, v in scalars.items()}, now))
        if len(self.pending) >= PENDING or now - self.handed_at >= PENDING_S:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the writer the pending steps, one event each (all of a step's scalars)."""
        pending, self.pending = self.pending, []  # each handed over once, even on an error
        self.handed_at = time.time()
        Summary = _summary_proto()
        events = self.writer.file_writer
        for step, scalars, wall_time in pending:
            values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
            events.add_summary(Summary(value=values), step, wall_time)

    def record(self, record: dict[str, Any]) -> None:
        self.log(record["step"], record_scalars(record))
        self.flush()  # an evaluation is worth seeing now, not at the writer's next flush

    def flush(self) -> None:
        with writing(self.directory):  # (a dead writer thread raises its error on a write)
            self.hand_over()
            self.writer.flush()

    def close(self) -> None:
        with writing(self.directory):
            try:
                self.hand_over()
            finally:
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
