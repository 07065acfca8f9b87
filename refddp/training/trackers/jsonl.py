"""``--log-to jsonl`` (always on): ``history.jsonl``, one JSON line per evaluation, and one per
step skipped as non-finite (``{"step": 13, "skipped": "<cause>", "skipped_steps": 2}``: no
``val_loss``: ``python -m refddp.plot`` leaves them out).

It holds the run's own lines only. A resumed run first drops the lines past the step it
resumes from: the evaluations a killed invocation recorded after its last checkpoint, which
the resumed run redoes. A run that starts afresh in a used directory (``--resume never``)
drops them all: an earlier run's lines would read as this run's.
"""

from __future__ import annotations

import json
import os
from typing import Any

from refddp.checkpoints.run_files import writing
from refddp.training.trackers.base import Run, Tracker


class History(Tracker):
    name = "jsonl"
    logs_steps = False  # one line per evaluation: python -m refddp.plot reads these

    def __init__(self, run: Run):
        super().__init__(run)
        self.path = os.path.join(run.out, "history.jsonl")
        if run.resumed:
            truncate_history(self.path, run.start_step)
        elif os.path.exists(self.path):  # a fresh run: the earlier run's lines go, unread
            with writing(self.path), open(self.path, "w"):
                pass

    def record(self, record: dict[str, Any]) -> None:
        with writing(self.path), open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def skipped(self, step: int, cause: str, total: int) -> None:
        self.record({"step": step, "skipped": cause, "skipped_steps": total})


def truncate_history(path: str, step: int) -> None:
    """Drop evaluations past ``step`` (a resume will redo them)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [ln for ln in f if ln.strip() and json.loads(ln).get("step", 0) <= step]
    tmp = path + ".tmp"
    with writing(path), open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


TRACKER = History
