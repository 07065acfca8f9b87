"""What every rank must agree on each step, in one small all-reduce written where it happens.

Each step every rank sums ``[targets, loss sum of the step before, one flag per stop signal]``
over all ranks with one ``dist.all_reduce(async_op=True)``, started as soon as the step's
micro-batches are fetched, so it is in flight while the first forward runs:

- the step's **global target count**, the loss's normaliser: each rank counts its micro-batches'
  targets before any forward (``Objective.count``), and the first backward waits for the sum
  (a per-sample loss knows it already: the global batch, and waits only at the step's end);
- a **stop signal** (SIGTERM, SIGINT, SIGUSR1, which SLURM sends before a time limit with
  ``--signal=USR1@SECONDS``) received on any rank before the step started: every rank reads the
  sum at the same step's end and stops there, together;
- the **loss sum of the step before**, for the trackers' per-step curve (``LateLoss``: a step
  late, since the loss is only known after the forward, when the all-reduce is long under way).

Whether a step is applied is decided without this all-reduce: from the gradient's norm after
DDP's all-reduce, the same on every rank (``refddp/training/skips.py``).

Before anything a step leaves behind (an evaluation, a checkpoint, the end) the trainer calls
``send(0, ...)`` once more and reads at once (``Trainer.settle``): the last step's loss and a
late stop signal are then agreed too.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from refddp.launch.stop_signals import StopRequest


class NonFiniteStep(RuntimeError):
    """A run ended by non-finite steps (``on_nonfinite=stop``, ``max_consecutive_skips``, amp
    fp16's ``min_loss_scale``: ``refddp/training/skips.py``), raised on every rank alike.

    ``recorded``: the rank handed the message to refddp's launcher, which prints it once with
    the ranks that stopped (a rank tearing down may be ended by the agent before it can print).
    """

    def __init__(self, message: str, recorded: bool = False):
        super().__init__(message)
        self.recorded = recorded


class Agreed(NamedTuple):
    """A step's agreement, read on the host: the global target count, the global loss sum of
    the step before (0.0 if none was sent), the stop signal any rank received (0: none), and
    the gradient norm read with them (NaN if none)."""

    targets: float
    previous_loss_sum: float
    signal: int
    grad_norm: float = math.nan


class StepAgreement:
    """One rank's side of the per-step all-reduce: ``send`` starts it, ``targets`` waits for
    the count (on the device), ``read`` waits and reads it all on the host.

    One process has nobody to agree with: it keeps what it was sent as it is, builds no
    tensor (at a small step, the few tensor ops cost more than the step's other overhead),
    and reads the norm and a loss to log in one host read (``_read_alone``)."""

    def __init__(self, stop: StopRequest, device: torch.device, world_size: int):
        self.stop, self.device, self.several = stop, device, world_size > 1
        # One flag per stop signal, set for the one received: made once per state, in float64
        # like the counts (exact up to 2**53 targets a step).
        self._signal_flags = {
            sig: torch.tensor([float(sig == s) for s in StopRequest.SIGNALS],
                              dtype=torch.float64, device=device)
            for sig in (None, *StopRequest.SIGNALS)
        }  # fmt: skip
        self._zero = torch.zeros(1, dtype=torch.float64, device=device)
        self._sums: torch.Tensor | None = None
        self._work: Any = None
        self._sent: tuple[int, torch.Tensor | None] = (0, None)  # one process's

    def send(self, targets: int, previous_loss: torch.Tensor | None) -> None:
        """Start summing this rank's ``targets`` (this step's, counted on the host),
        ``previous_loss`` (the loss sum of the step before, to log; None if none) and its
        stop flags over ranks."""
        self._sent = (targets, previous_loss)
        if not self.several:
            return
        # A fill on the device, not a copy from the host (which would wait for the device).
        count = torch.full((1,), float(targets), dtype=torch.float64, device=self.device)
        loss = self._zero if previous_loss is None else previous_loss.reshape(1).double()
        sums = torch.cat([count, loss, self._signal_flags[self.stop.signal]])
        self._work = dist.all_reduce(sums, async_op=True)
        self._sums = sums

    def _wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None
        assert self._sums is not None, "read before send"
        return self._sums

    def targets(self) -> torch.Tensor:
        """The global target count of the step sent, on the device (float64)."""
        if not self.several:
            return torch.full((), float(self._sent[0]), dtype=torch.float64, device=self.device)
        return self._wait()[0]

    def read(self, grad_norm: torch.Tensor | None = None) -> Agreed:
        """Everything sent, summed over ranks, on the host; with ``grad_norm`` (this rank's
        value, the same on every rank) in the same read: one host read a step."""
        if not self.several:
            return self._read_alone(grad_norm)
        sums = self._wait()
        if grad_norm is not None:
            sums = torch.cat([sums, grad_norm.reshape(1).to(sums)])
        values = sums.tolist()
        norm = values.pop() if grad_norm is not None else math.nan
        return decode(values)._replace(grad_norm=norm)


    def _read_alone(self, grad_norm: torch.Tensor | None) -> Agreed:
        """One process's ``read``: what it sent, as it is; the norm and a loss to log, where
        both are there, in one host read."""
        targets, loss = self._sent
        signum = self.stop.signal or 0
        if loss is None or grad_norm is None:
            norm = math.nan if grad_norm is None else float(grad_norm)
            return Agreed(float(targets), 0.0 if loss is None else float(loss), signum, norm)
        norm, loss_sum = torch.stack([grad_norm.reshape(()).double(),
                                      loss.reshape(()).double()]).tolist()  # fmt: skip
        return Agreed(float(targets), loss_sum, signum, norm)


def decode(sums: list[float]) -> Agreed:
    """``[targets, loss sum, one flag per stop signal]`` summed over ranks, as ``Agreed``.
    Where ranks received different signals, the first in ``StopRequest.SIGNALS`` wins."""
    targets, loss_sum, *flags = sums
    signum = next((int(s) for s, raised in zip(StopRequest.SIGNALS, flags, strict=True)
                   if raised), 0)  # fmt: skip
    return Agreed(targets, loss_sum, signum)


def ranks_with_nonfinite_loss(step_loss: torch.Tensor, several: bool) -> int:
    """How many ranks' step loss is non-finite: a collective every rank calls (``several``
    ranks), only where the gradient was non-finite (the same on every rank), to say why."""
    flag = (~torch.isfinite(step_loss.detach())).to(torch.float64).reshape(1)
    if several:
        dist.all_reduce(flag)
    return int(flag.item())


class LateLoss:
    """A step's loss for the trackers, logged one step late: the next agreement (``send``)
    carries it to every rank, so the per-step curve costs no collective or host read of its
    own. Only every ``every``-th step's is held (0: none; ``--log-every`` where a tracker
    logs steps)."""

    def __init__(self, trackers: Any, every: int):
        self.trackers, self.every = trackers, every
        self.held: tuple[int, torch.Tensor, float, float] | None = None

    def hold(self, step: int, loss_sum: torch.Tensor, targets: float, lr: float) -> None:
        """Step ``step``'s loss sum (this rank's, on the device), its global target count and
        the learning rate it ran at, if the trackers log that step."""
        due = bool(self.every) and step % self.every == 0
        self.held = (step, loss_sum, targets, lr) if due else None

    def to_send(self) -> torch.Tensor | None:
        """The held loss sum, for the agreement about to be sent (None: nothing held)."""
        return None if self.held is None else self.held[1]

    def agreed(self, loss_sum: float) -> None:
        """The agreement came back with the held step's global ``loss_sum``: log it."""
        if self.held is not None:
            step, _, targets, lr = self.held
            loss = loss_sum / targets if targets else math.nan
            self.trackers.log(step, {"train/loss": loss, "train/lr": lr})
        self.held = None
