"""``--log-to jsonl`` (always on): ``history.jsonl``, one JSON line per evaluation, and one per
step skipped as non-finite (``{"step": 13, "skipped": "<cause>", "skipped_steps": 2}``: no
``val_loss``: ``python -m refddp.plot`` leaves them out).

It holds the run's own lines only. A resumed run first drops the lines past the step it
resumes from: the evaluations a killed invocation recorded after its last checkpoint, which
the resumed run redoes. A run that starts afresh in a used directory (``--resume never``)
drops them all: an earlier run's lines would read as this run's.

Every line is strict JSON: a non-finite number (a window whose every step was skipped has no
mean loss; a NaN validation loss) is written as ``null``. Python's ``NaN`` and ``Infinity``
are an extension that ``json`` and jq read and most other parsers refuse.
"""

from __future__ import annotations

import json
import math
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
            f.write(strict_json(record) + "\n")

    def skipped(self, step: int, cause: str, total: int) -> None:
        self.record({"step": step, "skipped": cause, "skipped_steps": total})


def strict_json(value: Any, indent: int | None = None) -> str:
    """``value`` as strict JSON, each non-finite number (``nan``, ``inf``) as ``null``."""
    return json.dumps(_finite_or_none(value), indent=indent, allow_nan=False)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value


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
