"""``--log-to wandb``: a Weights & Biases run whose files are in ``OUT/wandb/``.

Offline unless ``WANDB_MODE`` says otherwise or ``WANDB_API_KEY`` is set (a machine without
network, a cluster node): ``wandb sync OUT/wandb/offline-run-*`` uploads it later. Every
invocation of a refddp run is the same W&B run: its id is kept in ``OUT/wandb/refddp-run-id``
and an invocation that resumes the run resumes it (``resume="allow"``). W&B keeps a run's
steps increasing: what a killed invocation logged after its last checkpoint stays, and the
resumed run's repeats of those steps are left out (refddp's resume is exact: it computes the
same losses there). Online, this tracker skips them itself, so W&B has nothing to warn about.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from refddp.checkpoints.run_files import writing
from refddp.training.trackers.base import Run, Tracker, missing_extra, record_scalars

RUN_ID_FILE = "refddp-run-id"


class WandB(Tracker):
    name = "wandb"

    @classmethod
    def check_installed(cls) -> None:
        _wandb()

    def __init__(self, run: Run):
        super().__init__(run)
        wandb = _wandb()
        directory = os.path.join(run.out, "wandb")
        with writing(directory):
            os.makedirs(directory, exist_ok=True)
            run_id = _run_id(os.path.join(directory, RUN_ID_FILE), run.resumed)
        online = os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE")
        self.wandb_run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "refddp"),
            name=os.path.basename(os.path.abspath(run.out)),
            id=run_id,
            resume="allow",
            dir=run.out,
            config=run.config,
            mode="online" if online else os.environ.get("WANDB_MODE", "offline"),
            # refddp logs its own output; W&B's console capture and system sampling would only
            # add threads to rank 0
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        self.first_step = self.wandb_run.step  # > 0: a resumed online run's next step

    def log(self, step: int, scalars: dict[str, float]) -> None:
        if step >= self.first_step:
            self.wandb_run.log(scalars, step=step)

    def record(self, record: dict[str, Any]) -> None:
        self.log(record["step"], record_scalars(record))

    def close(self) -> None:
        self.wandb_run.finish()

    def close_failed(self) -> None:
        """Finish the W&B run as failed. Left open, wandb's exit handler (which refddp's end of
        a process runs) would finish it with exit code 0, as a run that succeeded."""
        self.wandb_run.finish(exit_code=1)


def _wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise missing_extra("wandb", "wandb") from None
    return wandb


def _run_id(path: str, resumed: bool) -> str:
    """The W&B run id of this refddp run: made by its first invocation, kept by those that
    resume it (a new run in the same directory, ``--resume never``, is a new W&B run)."""
    if resumed and os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    run_id = uuid.uuid4().hex[:12]
    with open(path, "w") as f:
        f.write(run_id + "\n")
    return run_id


TRACKER = WandB
