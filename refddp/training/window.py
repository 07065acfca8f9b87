"""What training measures between two evaluations: time, samples, targets, the loss.

Each evaluation's history record covers one window; a checkpoint carries the open window over,
so a resumed run's next record covers the same steps as an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Window:
    """One rank's window. Times are this rank's; samples and targets count the global batch.

    The loss is summed over the targets of the steps whose update was applied, in float64, on
    the device (no host read of its own); an evaluation all-reduces it.
    """

    loss_sum: torch.Tensor
    loss_targets: float
    start: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0  # carried over from before a resume
    samples: int = 0
    targets: float = 0.0  # the global batches' targets, as the step agreements counted them
    steps: int = 0
    data_wait: float = 0.0
    # This rank's own time computing its share of the steps, this invocation only (what
    # ``Trainer.train_step`` times: never a wait for slower ranks): the straggler report
    # compares ranks on it (``refddp/training/stragglers.py``), with the data wait and steps this
    # invocation added (a resumed window carries rank 0's from before).
    compute: float = 0.0
    carried_data_wait: float = 0.0
    carried_steps: int = 0

    @classmethod
    def open(cls, device: torch.device, saved: dict[str, Any] | None = None) -> Window:
        """A new window; ``saved``: the one a checkpoint carried over (``Window.saved``)."""
        saved = saved or {}
        loss_sum, loss_targets = saved.get("loss", (0.0, 0.0))
        return cls(
            loss_sum=torch.tensor(loss_sum, dtype=torch.float64, device=device),
            loss_targets=float(loss_targets),
            seconds=saved.get("seconds", 0.0),
            samples=saved.get("samples", 0),
            targets=saved.get("targets", 0.0),
            steps=saved.get("steps", 0),
            data_wait=saved.get("data_wait", 0.0),
            carried_data_wait=saved.get("data_wait", 0.0),
            carried_steps=saved.get("steps", 0),
        )

    @contextlib.contextmanager
    def computing(self, counted: bool = True) -> Iterator[None]:
        """Time what runs inside as this rank's compute (unless not ``counted``)."""
        started = time.perf_counter()
        yield
        if counted:
            self.compute += time.perf_counter() - started

    def add_loss(self, total: torch.Tensor, targets: int) -> None:
        """Count an applied step's loss: this rank's sum (on the device) over its ``targets``
        (counted on the host)."""
        self.loss_sum += total
        self.loss_targets += targets

    def elapsed(self) -> float:
        """Seconds of training in this window (a resume's carried-over share included)."""
        return self.seconds + time.perf_counter() - self.start

    def exclude(self, since: float) -> None:
        """Leave the time since ``since`` (a save, say) out of the training time."""
        self.start += time.perf_counter() - since

    def saved(self) -> dict[str, Any]:
        """The window for a checkpoint (this rank's loss goes separately, per rank)."""
        return {
            "seconds": self.elapsed(),
            "samples": self.samples,
            "targets": self.targets,
            "steps": self.steps,
            "data_wait": self.data_wait,
        }

    def rank_times(self) -> tuple[float, float, int]:
        """This rank's (compute, data wait) seconds over this invocation's steps of the window,
        and those steps."""
        waited, steps = self.data_wait - self.carried_data_wait, self.steps - self.carried_steps
        return self.compute, waited, steps

    def local_loss(self) -> list[float]:
        """This rank's [loss sum, targets] (a host sync: at saves only)."""
        return [float(self.loss_sum), float(self.loss_targets)]

    def loss_tensor(self) -> torch.Tensor:
        """This rank's [loss sum, targets] as one float64 tensor (to all-reduce)."""
        device = self.loss_sum.device
        targets = torch.full((1,), self.loss_targets, dtype=torch.float64, device=device)
        return torch.cat([self.loss_sum.reshape(1), targets])
