"""The tracker interface, and the fan-out the trainer talks to (``Trackers``).

Every tracker runs on rank 0 only and never issues a collective (the trainer calls the
fan-out on every rank; on the others it holds no tracker). What a tracker receives:

- ``log(step, scalars)``: the training loss (the global mean over the step's targets) and the
  learning rate, every ``--log-every`` steps. The loss rides the next step's agreement
  (``refddp/training/step_agreement.py``) and is read with it: no host read of its own (that
  step meets for it where, with a per-sample loss, it would not otherwise).
- ``record(record)``: one evaluation's history record (validation metrics, the window's mean
  training loss, throughput, data wait, memory, stragglers, skipped steps so far), as
  ``history.jsonl`` holds it.
- ``skipped(step, cause, total)``: a step skipped as non-finite (``refddp/training/skips.py``),
  why, and the run's count so far: ``history.jsonl`` writes a line for it, the others log the
  count as ``train/skipped_steps``.
- ``flush()`` before every checkpoint is written: what a killed run logged up to its last
  checkpoint is on disk, and its resume (``Run.start_step``) continues from there. A tracker
  hides what a killed invocation logged after that checkpoint (TensorBoard: ``purge_step``).
- ``close()`` when the invocation ends, ``close_failed()`` when it fails instead (a stop for
  non-finite steps, a non-finite final evaluation, an error on a rank, a tracker that failed
  to open, flush or close): W&B marks that run failed (exit code 1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from refddp.config.schema import ConfigError
from refddp.training import trackers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """What a tracker is told when it opens."""

    out: str  # the run directory
    config: dict[str, Any]  # the resolved config (TrainConfig.to_dict())
    start_step: int  # the optimizer step this invocation starts from
    resumed: bool  # True: a resumed run, which logged up to start_step before


class Tracker:
    """One destination of a run's metrics (a module's ``TRACKER``)."""

    name = ""
    logs_steps = True  # False: takes evaluation records only (history.jsonl)

    def __init__(self, run: Run):
        self.run = run

    @classmethod
    def check_installed(cls) -> None:
        """Raise ``missing_extra``'s one-line error if this tracker's package is missing
        (checked before any rank starts)."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """The training loss and learning rate at optimizer step ``step``."""

    def record(self, record: dict[str, Any]) -> None:
        """One evaluation's history record (its ``step`` says when)."""

    def skipped(self, step: int, cause: str, total: int) -> None:
        """Step ``step`` was skipped for ``cause``; the run has skipped ``total`` so far."""
        self.log(step, {"train/skipped_steps": float(total)})

    def flush(self) -> None:
        """Put everything logged so far on disk (a checkpoint is about to be written)."""

    def close(self) -> None:
        """The run is over (or this invocation stops): flush and let go."""

    def close_failed(self) -> None:
        """The run failed: flush and let go, marking the run failed where the tracker can. By
        default, as ``close``."""
        self.close()


def missing_extra(tracker: str, extra: str) -> ConfigError:
    """The one-line error for a tracker whose optional package is not installed."""
    return ConfigError(
        f"log_to: {tracker} needs the {extra} package: pip install 'refddp[{extra}]'"
    )


TAG_GROUPS = {"train_loss": "train/mean_loss", "epoch": "train/epoch",
              "peak_memory_mb": "memory/peak_mb",
              "skipped_steps": "train/skipped_steps"}  # fmt: skip


def record_scalars(record: dict[str, Any]) -> dict[str, float]:
    """A history record's numbers under tracker tags: ``val_acc`` -> ``val/acc``,
    ``train_loss`` (the window's mean) -> ``train/mean_loss``, ``straggler_*`` ->
    ``stragglers/*``, throughput and the rest -> ``perf/NAME``."""
    found = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key in TAG_GROUPS:
            tag = TAG_GROUPS[key]
        elif key.startswith("val_"):
            tag = "val/" + key[len("val_") :]
        elif key.startswith("straggler_") or key == "slowest_rank":
            tag = "stragglers/" + key.removeprefix("straggler_")
        else:
            tag = "perf/" + key
        found[tag] = float(value)
    return found


class Trackers:
    """The run's trackers, on rank 0 (none elsewhere): the trainer's one seam to them.

    ``log`` and ``flush`` run where rank 0 may not fail alone (the other ranks would wait for
    it in the next collective): a tracker's error there is kept and raised at the next
    ``record`` or ``close``, which the trainer calls where every rank meets
    (``rank0_then_meet``).
    """

    def __init__(self, opened: list[Tracker] | None = None):
        self.opened = opened or []
        self.logs_steps = any(t.logs_steps for t in self.opened)
        self._failed: BaseException | None = None

    @classmethod
    def open(cls, names: list[str], run: Run) -> Trackers:
        """``jsonl`` and the trackers ``names`` lists (``--log-to``), opened in that order."""
        wanted = dict.fromkeys([trackers.ALWAYS, *names])
        opened: list[Tracker] = []
        try:
            for name in wanted:
                opened.append(trackers.tracker_class(name)(run))
        except BaseException:
            cls(opened).close_failed()  # the run fails here: those opened close as failed
            raise
        return cls(opened)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """The training loss and learning rate at ``step``, to the trackers that take them."""
        for tracker in self.opened:
            if tracker.logs_steps:
                self._keeping_failure(tracker.log, step, scalars)

    def skipped(self, step: int, cause: str, total: int) -> None:
        """A skipped step, to every tracker (where ``log`` is called: it raises nothing)."""
        for tracker in self.opened:
            self._keeping_failure(tracker.skipped, step, cause, total)

    def flush(self) -> None:
        """Before a checkpoint (every rank calls it there, so it raises nothing: see ``log``)."""
        for tracker in self.opened:
            self._keeping_failure(tracker.flush)

    def _keeping_failure(self, call: Any, *args: Any) -> None:
        if self._failed is None:
            try:
                call(*args)
            except Exception as exc:  # raised where every rank meets: see the class
                self._failed = exc

    def _raise_failure(self) -> None:
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def record(self, record: dict[str, Any]) -> None:
        """An evaluation's record, to every tracker (``rank0_then_meet``: an error fails every
        rank), after any error kept since the last one."""
        self._raise_failure()
        for tracker in self.opened:
            tracker.record(record)

    def close(self) -> None:
        """The end of this invocation (``rank0_then_meet``): every tracker flushes, then closes.
        An error kept since the last record, or one a tracker raises as it flushes or closes,
        fails the run: the trackers not closed yet close as failed (``close_failed``), and the
        error is raised. Flushing them all first puts a likely failure (a full disk) before
        any tracker has closed as done."""
        self.flush()
        if self._failed is not None:
            failed, self._failed = self._failed, None
            self.close_failed()
            raise failed
        while self.opened:
            tracker = self.opened.pop(0)
            try:
                tracker.close()
            except BaseException:
                self.close_failed()
                raise
        self.logs_steps = False

    def close_failed(self) -> None:
        """The run failed (the trainer is raising, or a tracker failed): every tracker still
        open closes, marking the run failed where it can. A tracker's ``Exception`` here, or
        one kept from ``log`` or ``flush``, is logged, not raised: the run's own failure is the
        one to report. Any other (a second Ctrl-C) is raised once every tracker has closed."""
        opened, self.opened, self.logs_steps = self.opened, [], False
        if self._failed is not None:
            failed, self._failed = self._failed, None
            log.warning("log_to: a tracker had failed earlier: %r", failed)
        interrupted: BaseException | None = None
        for tracker in opened:
            try:
                tracker.close_failed()
            except Exception as exc:
                log.warning("log_to: %s did not close after the failure: %r", tracker.name, exc)
            except BaseException as exc:  # (a second Ctrl-C, say): the others close first
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
