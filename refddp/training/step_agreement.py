"""What the ranks must agree on each step, in one small all-reduce written where it happens,
made only on the steps that need it.

A step that meets sums ``[targets, loss sum of the step before, one flag per stop signal,
microseconds since the ranks last met]`` over all ranks with one
``dist.all_reduce(async_op=True)``, started as soon as the step's micro-batches are fetched, so
it is in flight while the first forward runs:

- the step's **global target count**, the loss's normaliser: each rank counts its micro-batches'
  targets before any forward (``Objective.count``), and the first backward waits for the sum.
  A per-sample loss knows it already (the global batch): its steps need not meet for it;
- the **loss sum of the step before**, for the trackers' per-step curve (``LateLoss``: a step
  late, since the loss is only known after the forward, when the all-reduce is long under way),
  on the steps after a logged one;
- a **stop signal** (SIGTERM, SIGINT, SIGUSR1, which SLURM sends before a time limit with
  ``--signal=USR1@SECONDS``) received on any rank before the step started: every rank reads the
  sum at the same step's end and stops there, together. Where no step needs to meet for the
  two reasons above, the ranks still meet for this about every ``stop_check_s`` seconds
  (``StopCheck``: as many steps as took that long at the last interval's pace).

Whether a step is applied is decided without this all-reduce: from the gradient's norm after
DDP's all-reduce, the same on every rank (``refddp/training/skips.py``).

Before anything a step leaves behind (an evaluation, a checkpoint, the end) the ranks meet once
more and read at once (``StepAgreement.settle``, from ``Trainer.settle``): the last step's loss
and a late stop signal are then agreed too.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

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


class StopCheck:
    """How often the ranks meet only to agree on a stop signal: every ``every_s`` seconds (0:
    every step), as a number of steps that every rank derives alike from the last interval's
    pace.

    Each meeting carries each rank's time since its last one in whole microseconds; their sum
    is exact in float64 (below 2**53), so every rank reads the same sum and computes the same
    next interval from it (``next_interval``), and the ranks skip and meet on the same steps.
    The first two steps after a start meet (the second measures a step); an interval never
    exceeds ``MAX_STEPS``. The time counted is wall time, an evaluation or a checkpoint
    included, which only makes the next interval shorter; steps that slow down after a meeting
    make the wait for the next longer than ``every_s``, by as much as they slowed."""

    MAX_STEPS = 1000

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.every = 1  # meet on every this-many-th step
        self.skipped_since_meeting = 0  # steps since the ranks last met that did not meet
        self.steps_since_vote = 0  # steps begun since this rank's last vote
        self.steps_in_last_vote = 0  # the steps the last vote's time covers
        self.voted_at = time.perf_counter()

    def skip_this_step(self) -> bool:
        """Whether the step beginning now goes without meeting; counts it if so (call once a
        step that need not meet for another reason)."""
        if self.skipped_since_meeting + 1 >= self.every:
            return False
        self.skipped_since_meeting += 1
        self.steps_since_vote += 1
        return True

    def elapsed_us(self, at_a_step: bool) -> float:
        """This rank's vote for a meeting now: its whole microseconds since its last vote
        (``at_a_step``: a step's meeting, the step beginning after it; else between steps)."""
        now = time.perf_counter()
        elapsed, self.voted_at = now - self.voted_at, now
        self.steps_in_last_vote, self.steps_since_vote = self.steps_since_vote, int(at_a_step)
        self.skipped_since_meeting = 0
        return float(int(elapsed * 1e6))

    def next_interval(self, summed_us: float, world_size: int) -> None:
        """The meeting's votes came back summed: the next interval, from the mean time of the
        steps the votes covered (as many on every rank)."""
        if self.steps_in_last_vote and self.every_s:
            step_us = max(summed_us / world_size / self.steps_in_last_vote, 1.0)
            self.every = max(1, int(min(self.MAX_STEPS, self.every_s * 1e6 / step_us)))


class StepAgreement:
    """One rank's side of the per-step all-reduce: ``send`` starts it where the step meets,
    ``targets`` waits for the count (on the device), ``read`` waits and reads it all on the host.

    One process has nobody to agree with: it keeps what it was sent as it is, builds no
    tensor (at a small step, the few tensor ops cost more than the step's other overhead),
    and reads the norm and a loss to log in one host read (``_read_alone``)."""

    def __init__(self, stop: StopRequest, device: torch.device, world_size: int,
                 stop_check_s: float):  # fmt: skip
        self.stop, self.device, self.several = stop, device, world_size > 1
        self.world_size = world_size
        self.check = StopCheck(stop_check_s)
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
        self.step_met = False  # whether the step sent last met
        self._sent: tuple[int, torch.Tensor | None, int | None] = (0, None, None)

    def send(self, targets: int, previous_loss: torch.Tensor | None,
             known_total: int | None = None) -> None:  # fmt: skip
        """Start summing this rank's ``targets`` (this step's, counted on the host),
        ``previous_loss`` (the loss sum of the step before, to log; None if none) and its
        stop flags over ranks. ``known_total``: the global target count where every rank
        knows it without meeting (a per-sample loss: the global batch); a step with such a
        count and no loss to send meets only when the stop check is due (``StopCheck``)."""
        self._sent = (targets, previous_loss, known_total)
        if not self.several:
            return
        if known_total is not None and previous_loss is None and self.check.skip_this_step():
            self.step_met = False
            return
        self._meet(targets, previous_loss, at_a_step=True)

    def settle(self, previous_loss: torch.Tensor | None) -> Agreed:
        """Meet now, between steps (before an evaluation, a checkpoint, the end), and read:
        ``previous_loss`` (None if none) and every rank's stop signal."""
        self._sent = (0, previous_loss, None)
        if self.several:
            self._meet(0, previous_loss, at_a_step=False)
        return self.read()

    def _meet(self, targets: int, previous_loss: torch.Tensor | None, at_a_step: bool) -> None:
        """Start the all-reduce (``at_a_step``: a step's, else a settle's)."""
        self.step_met = True
        # Fills on the device, not copies from the host (which would wait for the device).
        count = torch.full((1,), float(targets), dtype=torch.float64, device=self.device)
        loss = self._zero if previous_loss is None else previous_loss.reshape(1).double()
        voted = self.check.elapsed_us(at_a_step)
        since = torch.full((1,), voted, dtype=torch.float64, device=self.device)
        sums = torch.cat([count, loss, self._signal_flags[self.stop.signal], since])
        self._work = dist.all_reduce(sums, async_op=True)
        self._sums = sums

    def _wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None
        assert self._sums is not None and self.step_met, "read of a step that did not meet"
        return self._sums

    def targets(self) -> torch.Tensor:
        """The global target count of the step sent, on the device (float64)."""
        if not self.several:
            return torch.full((), float(self._sent[0]), dtype=torch.float64, device=self.device)
        return self._wait()[0]

    def read(self, grad_norm: torch.Tensor | None = None) -> Agreed:
        """Everything sent, summed over ranks, on the host; with ``grad_norm`` (this rank's
        value, the same on every rank) in the same read: one host read a step. A step that
        did not meet reads the norm alone, with its known count and no signal."""
        if not self.several:
            return self._read_alone(grad_norm)
        if not self.step_met:
            _, _, known_total = self._sent
            assert known_total is not None
            norm = math.nan if grad_norm is None else float(grad_norm)
            return Agreed(float(known_total), 0.0, 0, norm)
        sums = self._wait()
        if grad_norm is not None:
            sums = torch.cat([sums, grad_norm.reshape(1).to(sums)])
        values = sums.tolist()
        norm = values.pop() if grad_norm is not None else math.nan
        self.check.next_interval(values.pop(), self.world_size)
        return decode(values)._replace(grad_norm=norm)

    def _read_alone(self, grad_norm: torch.Tensor | None) -> Agreed:
        """One process's ``read``: what it sent, as it is; the norm and a loss to log, where
        both are there, in one host read."""
        targets, loss, _ = self._sent
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


class Nonfinite(NamedTuple):
    """Why and where a skipped step was non-finite, the same on every rank: how many ranks'
    step loss was; the parameters, of those every rank holds alike, whose gradient held an
    inf or a NaN on any rank; and the ranks where one of the parameters DDP ignores did
    (those differ between ranks, and only their own rank can name them)."""

    bad_ranks: int
    parameters: list[str]
    ignored_on: list[int]


def where_nonfinite(step_loss: torch.Tensor, shared: list[tuple[str, torch.Tensor]],
                    own: list[torch.Tensor], rank: int, world_size: int) -> Nonfinite:  # fmt: skip
    """One all-reduce, which every rank calls only at a skipped step (the gradient's norm says
    that a step is non-finite, not where), of this rank's loss flag, a flag for each of the
    ``shared`` parameters (named, in the same order on every rank: those DDP reduces, whose
    shapes it checked alike at start; every parameter under FSDP), and a slot for each rank,
    set in this rank's own if one of its ``own`` parameters (those DDP ignores) has a
    non-finite gradient. Each rank checks the gradient it holds (under FSDP its shard), so the
    sum names every parameter alike on every rank."""
    device = step_loss.device
    flags = torch.zeros(1 + len(shared) + world_size, dtype=torch.float64, device=device)
    flags[0] = (~torch.isfinite(step_loss.detach())).to(torch.float64)
    if shared:
        largest = torch.stack([_largest(parameter.grad, device) for _, parameter in shared])
        flags[1:1 + len(shared)] = (~torch.isfinite(largest)).to(torch.float64)
    if own:
        largest = torch.stack([_largest(parameter.grad, device) for parameter in own])
        flags[1 + len(shared) + rank] = (~torch.isfinite(largest)).any().to(torch.float64)
    if world_size > 1:
        dist.all_reduce(flags)
    bad_ranks, *bad = flags.tolist()
    return Nonfinite(int(bad_ranks),
                     [name for (name, _), n in zip(shared, bad[:len(shared)], strict=True) if n],
                     [r for r, n in enumerate(bad[len(shared):]) if n])  # fmt: skip


def _largest(grad: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The largest magnitude in ``grad`` (this rank's: an FSDP shard's local part), NaN if it
    holds one (one reduction, with no temporary the size of the gradient); 0 with no
    gradient or an empty shard."""
    if isinstance(grad, DTensor):
        grad = grad.to_local()
    if grad is None or grad.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.linalg.vector_norm(grad.detach(), float("inf")).to(device, torch.float32)


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
