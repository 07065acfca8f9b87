"""What training measures between two evaluations: time, samples, targets, the loss.

Each evaluation's history record covers one window; a checkpoint carries the open window over,
so a resumed run's next record covers the same steps as an uninterrupted run's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Window:
    """One rank's window. Times are this rank's; samples and targets count the global batch.

    The loss is summed over the targets of the steps whose update was applied, in float64, on
    the device (no host sync per step) or, where the host reads every step's loss anyway (on
    the CPU and for one process, flags read now), on the host; an evaluation all-reduces it.
    """

    loss_sum: torch.Tensor | float
    loss_targets: torch.Tensor | float
    start: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0  # carried over from before a resume
    samples: int = 0
    targets: float = 0.0  # the global batches' targets, as the agreed flags counted them
    steps: int = 0
    data_wait: float = 0.0
    # This rank's own time computing its share of the steps (forward and backward, up to its
    # gradients being ready: not the wait for slower ranks), this invocation only: the
    # straggler report compares ranks on it (``refddp/stragglers.py``), with the data wait
    # and steps this invocation added (a resumed window carries rank 0's from before).
    compute: float = 0.0
    carried_data_wait: float = 0.0
    carried_steps: int = 0

    @classmethod
    def open(
        cls, device: torch.device, saved: dict[str, Any] | None = None, on_host: bool = False
    ) -> Window:
        """A new window; ``saved``: the one a checkpoint carried over (``Window.saved``);
        ``on_host``: the loss is summed in Python floats."""
        saved = saved or {}
        loss_sum, loss_targets = saved.get("loss", (0.0, 0.0))
        if on_host:  # (add_loss tells the two apart by the type)
            loss_sum, loss_targets = float(loss_sum), float(loss_targets)
        else:
            loss_sum = torch.tensor(loss_sum, dtype=torch.float64, device=device)
            loss_targets = torch.tensor(loss_targets, dtype=torch.float64, device=device)
        return cls(
            loss_sum=loss_sum,
            loss_targets=loss_targets,
            seconds=saved.get("seconds", 0.0),
            samples=saved.get("samples", 0),
            targets=saved.get("targets", 0.0),
            steps=saved.get("steps", 0),
            data_wait=saved.get("data_wait", 0.0),
            carried_data_wait=saved.get("data_wait", 0.0),
            carried_steps=saved.get("steps", 0),
        )

    def add_loss(
        self,
        total: torch.Tensor | float,
        targets: torch.Tensor | float,
        applied: torch.Tensor | bool,
    ) -> None:
        """Count a step's loss if its update was applied (``applied`` on the device: a step
        skipped there counts nothing, without the host knowing yet)."""
        if isinstance(applied, torch.Tensor):
            self.loss_sum += torch.where(applied, total, 0.0)
            self.loss_targets += applied * targets  # (an int multiplies on the device)
        elif not applied:
            return
        elif isinstance(self.loss_sum, float):  # read on the host: exact in float64
            self.loss_sum += float(total)
            self.loss_targets += float(targets)
        else:
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

    def loss_tensor(self, device: torch.device) -> torch.Tensor:
        """This rank's [loss sum, targets] as one float64 tensor on ``device`` (to all-reduce)."""
        if isinstance(self.loss_sum, float):
            return torch.tensor([self.loss_sum, self.loss_targets], dtype=torch.float64,
                                device=device)  # fmt: skip
        return torch.stack([self.loss_sum, self.loss_targets])
