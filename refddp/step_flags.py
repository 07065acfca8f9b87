"""What every rank must agree on after each step: a non-finite loss anywhere, a stop signal.

Each rank builds ``[non-finite loss, target count (two parts), one flag per stop signal, loss
sum]`` on the device, or on the CPU reading now from the host's values, as one tensor (the
signals are ``StopRequest.SIGNALS``: SIGTERM, SIGINT, and SIGUSR1, which SLURM sends before a
job's time limit with ``--signal=USR1@SECONDS``); the flags ride
the step's gradient all-reduce (``Parallel.set_flags``, then ``Parallel.backward``: under DDP
the gradient of a parameter of their own), so every rank holds the same sums and
takes the same branch, and knows the step's global target count, the loss's normaliser
(``refddp/trainer.py``), and its global loss sum: the trackers' training loss, read with the
flags and never on its own. When the host reads them is ``flags_read``:

- ``now``: before the optimizer step. Skip or step is a host decision, one host sync per step
  (free on CPU, where nothing runs ahead of the host).
- ``late``: a step later. The skip happens on the device, through the ``found_inf`` a fused
  optimizer takes (as GradScaler uses it): a non-finite step changes neither the weights nor
  the optimizer's state. The host reads the flags with a non-blocking copy once the next step
  is queued, so nothing waits; a stop request, the non-finite count and its warning (or
  ``on_nonfinite=stop``'s error) come one step later, on every rank alike. Before anything a
  step leaves behind (evaluation, checkpoint, stop, the end) the flags are read at once.
  Until the optimizer has state it reads ``now``: a fused optimizer's skipped first step would
  create its state (SGD's momentum buffer uninitialised), a step that reads ``now`` does not.
  An optimizer that never keeps state (SGD without momentum) reads ``late`` from the start.
- ``auto`` (the default): ``late`` on CUDA with several ranks, ``now`` on the CPU and for one
  process (``reads_late``).

One process reading ``now`` has nobody to agree with and no bucket to ride: its step's flags
are just its loss sum and target count as they are (``Alone``: no tensor built), read as
float64, and its own stop request is the signal. On one GPU their copy to the host starts as
soon as the loss is known, before the backward is queued, and the host waits for that copy
alone (an event), not for the whole step: the device runs the backward while the host
decides and fetches the next batch. (An ``.item()`` after the backward left the device idle
while the host did both: on an H100, 0.872x a plain loop per step for a GPT-2 whose compute
outlasts the host's work, 0.995x with the copy; ``benchmarks/README.md``.)
"""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from refddp.config import TrainConfig, has_fused_kernel

log = logging.getLogger("refddp")


class NonFiniteLoss(RuntimeError):
    """A non-finite loss with ``on_nonfinite=stop``."""


class StopRequest:
    """SIGTERM/SIGINT/SIGUSR1 set a flag; ranks agree on it where they next meet (the step's
    agreement, the evaluation's all-reduce, the end of a save) and stop together with a
    checkpoint. Where ranks received different signals, the first in ``SIGNALS`` names the
    stop (on every rank alike)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signal = signum


# What a rank's step flags hold (``StepFlags.local``): non-finite loss, target count (two
# parts), one flag per stop signal, loss sum.
FLAG_COUNT = 4 + len(StopRequest.SIGNALS)


def reads_late(c: TrainConfig, device: torch.device, world_size: int) -> bool:
    """``flags_read`` resolved. ``auto`` reads late where a host sync costs a step: on CUDA
    with several ranks (a read now waits for the slowest rank's all-reduce), unless fp16's
    GradScaler reads its own inf check every step anyway, or the optimizer has no fused kernel
    for the strategy (FSDP's sharded SGD). On the CPU nothing runs ahead of the host, so a read
    ``now`` is free and the optimizer keeps torch's default kernels; one process on one GPU
    reads now too, its own loss: measured on an H100, the ~25 small device ops a late read
    adds to a step cost more host time than the wait (``benchmarks/README.md``, GPU)."""
    if c.flags_read != "auto":
        return c.flags_read == "late"
    several = world_size > 1
    return several and c.amp != "fp16" and fuses_on_cuda(c, device)


def fuses_on_cuda(c: TrainConfig, device: torch.device) -> bool:
    """Whether the optimizer is built fused because the run is on CUDA: one kernel a step
    instead of a few per parameter group, read late or now (the CPU keeps torch's default).
    Not SGD under FSDP (torch has no fused SGD for sharded parameters) nor under amp fp16:
    GradScaler hands a fused optimizer its overflow check, and a fused SGD's overflowing
    first step creates the momentum buffer uninitialised, skips, and leaves it to the next."""
    no_kernel = not has_fused_kernel(c)
    skips_unsafely = c.amp == "fp16" and c.optimizer == "sgd"
    return device.type == "cuda" and not (no_kernel or skips_unsafely)


# The target count travels as two float32 parts, each summed exactly over ranks: a float32
# holds integers exactly up to 2**24 only, fewer targets than a large step can have.
COUNT_PART = 4096


class Agreed(NamedTuple):
    """What every rank learns of a step: a non-finite loss anywhere, the stop signal (0: none),
    the global batch's target count and loss sum (for the trackers' curves: float32 summed
    over ranks, float64 from one process)."""

    nonfinite: bool
    signal: int
    targets: float
    loss_sum: float = 0.0

    @property
    def loss(self) -> float:
        """The step's loss: the mean over the global batch's targets."""
        return self.loss_sum / self.targets if self.targets else math.nan


class Alone(NamedTuple):
    """One process's flags, read now: its step's loss sum and target count, as it had them
    (on one GPU also on their way to the host already: ``StepFlags.copy_early``)."""

    loss_sum: torch.Tensor
    targets: torch.Tensor | int


class Verdict(NamedTuple):
    """What ``StepFlags.apply`` did with a step: whether its update was applied (a device
    tensor when the device decided), and the flags the host read meanwhile, of which step."""

    applied: torch.Tensor | bool
    read_step: int | None
    read: Agreed | None


class StepFlags:
    """One rank's step flags: built on the device, agreed through ``parallel``, read now or a
    step late (the pending step's flags wait in ``_host``)."""

    def __init__(
        self, parallel: Any, stop: StopRequest, device: torch.device, late: bool,
        alone: bool = False, copy_early: bool | None = None, on_host: bool | None = None,
    ):  # fmt: skip
        self.parallel, self.stop, self.late = parallel, stop, late
        self._by_signal = {  # one flag per stop signal, set for the one received; made once
            sig: torch.tensor([sig == s for s in StopRequest.SIGNALS], dtype=torch.float32,
                              device=device)
            for sig in (None, *StopRequest.SIGNALS)
        }  # fmt: skip
        self._zero = torch.zeros(1, device=device)
        # Read now on the CPU, the loss is on the host already: the flags are made from its
        # floats, one tensor, where the device build takes ~10 small ops (~10 us a step on
        # the CPU). Read late (CUDA's mode; on the CPU only when chosen) they are built on the
        # device, as on CUDA.
        self.on_host = device.type == "cpu" and not late if on_host is None else on_host
        self._signal_floats = {sig: flags.tolist() for sig, flags in self._by_signal.items()}
        pinned = device.type == "cuda"
        self._host = torch.empty(FLAG_COUNT, dtype=torch.float32, pin_memory=pinned)
        # blocking: the host sleeps while it waits for the copy (a spin would take a core
        # from the data loader for up to a step)
        self._ready = torch.cuda.Event(blocking=True) if pinned else None
        self._pending_step: int | None = None  # the step whose flags wait in _host
        self.alone = alone and not late  # one process reading now: the short flags
        # Where one process copies its flags to the host when they are sent (on CUDA; the CPU
        # reads them where they are): [loss sum, target count] as float64, and the copy's event.
        early = self.alone and (pinned if copy_early is None else copy_early)
        buffer = torch.empty(2, dtype=torch.float64, pin_memory=pinned) if early else None
        self._early = buffer
        self._early_slots = buffer.unbind() if buffer is not None else ()  # one copy each
        # Its wait spins, as .item()'s did: the forward is mostly done by the time the backward
        # is queued, and a sleeping wait's wake-up would sit on every step's critical path.
        self._early_ready = torch.cuda.Event() if early and pinned else None

    def late_for(self, optimizer: torch.optim.Optimizer) -> bool:
        """With ``late`` set, whether this step reads late: the optimizer has state already, or
        never keeps any (the same on every rank: all step together). (``apply`` checks
        ``late`` first: read now, no call each step.)"""
        stateless = isinstance(optimizer, torch.optim.SGD) and not any(
            group["momentum"] for group in optimizer.param_groups
        )
        return bool(optimizer.state) or stateless

    def local(
        self, step_loss: torch.Tensor | None = None, targets: torch.Tensor | int = 0
    ) -> torch.Tensor:
        """This rank's [non-finite loss, target count (high, low), stop signals, loss sum],
        built on the device (no host sync), or on the CPU from the host's values.

        The first is 0 × the step's loss: 0 when it is finite, NaN when it is inf or NaN; summed
        over ranks it is NaN if any rank's loss was (and ``bool(nan)`` is True).
        """
        if self.on_host:
            loss_sum = 0.0 if step_loss is None else step_loss.item()
            count = targets.item() if isinstance(targets, torch.Tensor) else targets
            return torch.tensor([0.0 if math.isfinite(loss_sum) else math.nan,
                                 count // COUNT_PART, count % COUNT_PART,
                                 *self._signal_floats[self.stop.signal], loss_sum],
                                dtype=torch.float32)  # fmt: skip
        stop = self._by_signal[self.stop.signal]
        loss = self._zero if step_loss is None else step_loss.detach().view(1)
        nonfinite = (loss * 0).float()
        if not isinstance(targets, torch.Tensor):  # a fill on the device (a copy would sync)
            targets = torch.full((1,), targets, device=nonfinite.device)
        targets = targets.view(1)
        parts = torch.cat([targets.div(COUNT_PART, rounding_mode="floor"),
                           targets.remainder(COUNT_PART)]).float()  # fmt: skip
        return torch.cat([nonfinite, parts, stop, loss.float()])

    def send(self, step_loss: torch.Tensor, targets: torch.Tensor | int) -> torch.Tensor | Alone:
        """This step's flags (``local``), handed to the gradient all-reduce that carries them;
        one process reading now keeps its loss and count as they are (``Alone``)."""
        if self.alone:
            if self._early is not None:
                self.copy_early(step_loss, targets)
            return Alone(step_loss, targets)
        flags = self.local(step_loss, targets)
        self.parallel.set_flags(flags)
        return flags

    def copy_early(self, step_loss: torch.Tensor, targets: torch.Tensor | int) -> None:
        """Start copying one process's loss sum (and its target count, where counted on the
        device) to the host; ``read`` waits for the copy alone, not for what was queued after."""
        loss, count = self._early_slots  # of one pinned buffer: non-blocking copies
        loss.copy_(step_loss.detach().reshape(()), non_blocking=True)
        if isinstance(targets, torch.Tensor):
            count.copy_(targets.reshape(()), non_blocking=True)
        if self._early_ready is not None:
            self._early_ready.record()

    @staticmethod
    def targets(agreed: torch.Tensor) -> torch.Tensor:
        """The global target count of agreed flags, on the device (float64: exact)."""
        high, low = agreed[1:3].double().round()  # as in _decode
        return high * COUNT_PART + low

    def read(self, flags: torch.Tensor | Alone) -> Agreed:
        """Agree on ``flags`` and read them now (a host sync)."""
        if isinstance(flags, Alone):  # float64 from here: a count past 2**24 stays exact
            if self._early is not None:  # copied when sent
                if self._early_ready is not None:
                    self._early_ready.synchronize()  # the copy, queued before the backward
                loss_sum, counted = self._early.tolist()
                count = counted if isinstance(flags.targets, torch.Tensor) else flags.targets
            else:
                loss_sum, count = flags.loss_sum.item(), flags.targets
            targets = float(count)
            return Agreed(not math.isfinite(loss_sum), self.stop.signal or 0, targets, loss_sum)
        return _decode(self.parallel.agree(flags).tolist())

    def skip_on_device(self, flags: torch.Tensor, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Agree on ``flags`` and have ``optimizer`` (fused) skip its next step on the device if
        any rank's loss was non-finite. Returns the agreed flags, for ``defer``."""
        agreed = self.parallel.agree(flags)
        optimizer.found_inf = torch.isnan(agreed[0]).float()  # type: ignore[attr-defined]
        return agreed

    def defer(self, step: int, agreed: torch.Tensor) -> None:
        """Start copying ``step``'s agreed flags to the host; ``collect`` reads them."""
        self._host.copy_(agreed, non_blocking=self._ready is not None)
        if self._ready is not None:
            self._ready.record()
        self._pending_step = step

    def collect(self) -> tuple[int | None, Agreed | None]:
        """The pending step's flags: (that step, what was agreed). Waits for the copy, which was
        queued a step ago. (None, None) if none pends."""
        step, self._pending_step = self._pending_step, None
        if step is None:
            return None, None
        if self._ready is not None:
            self._ready.synchronize()
        return step, _decode(self._host.tolist())

    def apply(
        self,
        flags: torch.Tensor | Alone,
        optimizer: torch.optim.Optimizer,
        step: int,
        update: Callable[[torch.Tensor | float], None],
    ) -> Verdict:
        """Agree on step ``step``'s ``flags`` and run ``update(targets)`` (the global target
        count) unless any rank's loss was non-finite.

        Read now, the host decides; read late, the device skips the update through the fused
        optimizer's ``found_inf`` and the host reads the previous step's flags, copied while
        this step ran."""
        if self.late and self.late_for(optimizer):
            assert isinstance(flags, torch.Tensor)  # one process's short flags are read now
            agreed = self.skip_on_device(flags, optimizer)
            update(self.targets(agreed))
            applied = optimizer.found_inf == 0  # type: ignore[attr-defined]
            read_step, read = self.collect()
            self.defer(step, agreed)
            return Verdict(applied, read_step, read)
        read = self.read(flags)
        if read.nonfinite:
            optimizer.zero_grad(set_to_none=True)
        else:
            update(read.targets)
        return Verdict(not read.nonfinite, step, read)


def _decode(values: list[float]) -> Agreed:
    nonfinite, high, low, *signals, loss_sum = values
    # DDP agrees flags as a mean times the world size (``refddp/parallel.py``): over 3 ranks a
    # count part comes back within rounding of its integer, not on it
    high, low = round(high), round(low)
    signum = next((int(s) for s, raised in zip(StopRequest.SIGNALS, signals, strict=True)
                   if raised), 0)  # fmt: skip
    return Agreed(bool(nonfinite), signum, float(high * COUNT_PART + low), loss_sum)
