"""``--log-to tensorboard``: event files in ``OUT/tensorboard/`` (``torch.utils.tensorboard``).

One directory for the whole run, whatever its invocations: ``tensorboard --logdir OUT``
shows one set of curves. A resumed invocation opens its writer with ``purge_step`` = the
first step it runs: TensorBoard then hides what a killed invocation logged at or after that
step (written after its last checkpoint, and logged again by the resumed run), so the curves
continue without duplicate or missing points.
"""

from __future__ import annotations

import os
from typing import Any

from refddp.run_files import writing
from refddp.trackers.base import Run, Tracker, missing_extra, record_scalars


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

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def record(self, record: dict[str, Any]) -> None:
        self.log(record["step"], record_scalars(record))
        self.flush()  # an evaluation is worth seeing now, not at the writer's next flush

    def flush(self) -> None:
        with writing(self.directory):
            self.writer.flush()

    def close(self) -> None:
        with writing(self.directory):
            self.writer.close()


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise missing_extra("tensorboard", "tensorboard") from None
    return SummaryWriter


TRACKER = TensorBoard
