"""One training step of a ``Trainer``: forward and backward over the micro-batches, the loss's
normalisation by the global batch's target count, then the update, or the skip of a step whose
gradient is non-finite.

The step is the hot path: what it reads from the device and what it waits for are measured
(``benchmarks/step_overhead.py``) and guarded by their own tests, so it lives apart from the run
around it (set-up, checkpoints, evaluation and the loop: ``trainer.py``). These are plain
functions of the trainer, which ``trainer.py`` calls with itself: they read its parts as they
stand at each step (an evaluation opens a new window, a resume restores the position). Its type
is not named here, as ``trainer.py`` imports this module. Every rank runs the step in lock step:
the step's one small all-reduce (``StepAgreement``, on the steps that need it, the same on
every rank), the gradient's all-reduce and a skipped step's collectives are reached by every
rank alike.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time
from typing import Any

import torch
import torch.distributed as dist

from refddp.launch import host_random
from refddp.launch.error_file import AGREED_STOP, record_error
from refddp.training import skips
from refddp.training.skips import spread_nonfinite
from refddp.training.step_agreement import NonFiniteStep, where_nonfinite
from refddp.workload.objectives.batches import to_device

log = logging.getLogger("refddp")


def train_step(trainer: Any, batches: StepBatches) -> int:
    """One training step: forward and backward over ``grad_accum`` micro-batches, then the
    update (clip, step) unless the gradient is non-finite (then ``skip_step``).
    Returns the stop signal any rank had received when the step began, where the step met
    (0: none, or the step did not meet: ``StopCheck``)."""
    c, window = trainer.c, trainer.window
    waited = time.perf_counter()
    # From those fetched ahead (``fetch_next_step``), but at an epoch's first step.
    micro_batches = [next(batches) for _ in range(c.grad_accum)]
    window.data_wait += time.perf_counter() - waited
    if trainer.bucket_layout_pending:
        settle_ddp_buckets(trainer, micro_batches[0])
    # Counted before any forward, so that the agreement below is in flight while the
    # forward runs: the loss's normaliser is the global batch's target count.
    targets = host_target_count(trainer, micro_batches)
    # One small all-reduce on the steps that need it: the global target count (unless the
    # loss counts samples: then it is the global batch), the last step's loss for the
    # trackers, and every stop_check_s the stop signals (refddp/training/step_agreement.py).
    known = trainer.global_batch if trainer.objective.counts_samples else None
    trainer.agreement.send(targets, trainer.late_loss.to_send(), known_total=known)
    trainer.before_step.take()  # the buffers, put back if this step is skipped
    free_last_gradient(trainer)
    step_loss = None
    for micro, batch in enumerate(micro_batches):
        last = micro == c.grad_accum - 1
        # Only the last backward all-reduces the gradients; the others accumulate locally.
        with contextlib.nullcontext() if last else trainer.parallel.no_sync():
            with window.computing():
                loss = trainer.micro_loss(trainer.forward, on_device(trainer, batch))
            # world size / the global count (waited for here): the gradient is then the
            # global batch's mean; NaN where this rank's loss is non-finite, which the
            # gradient reduction carries to every rank (refddp/training/skips.py).
            scale = spread_nonfinite(loss_scale(trainer, loss.total.dtype), loss.total)
            with window.computing(not (last and trainer.several)):  # not the wait for others
                trainer.scaler.scale(loss.total * scale).backward()
        detached = loss.total.detach()
        step_loss = detached if step_loss is None else step_loss + detached
    assert step_loss is not None  # grad_accum >= 1
    # The update, unless the gradient is non-finite. After DDP's all-reduce every rank
    # holds the same gradient, so every rank finds the same norm and takes the same branch
    # (FSDP's norm is one all-reduce of the shards' norms).
    if trainer.scaling:
        trainer.scaler.unscale_(trainer.optimizer)  # the norm and clipping see the true gradient
    norm = trainer.parallel.grad_norm(c.grad_clip)  # clips too, with --grad-clip
    if trainer.watchdog:
        # Here, not after the update: a rank stuck fetching the next step's batches has then
        # marked the same step as its peers, which block in the next backward (DDP's
        # all-reduce) or forward (FSDP's all-gather) before they mark it again: every rank's
        # watchdog fires together, and each leaves its stack (refddp/training/watchdog.py).
        trainer.watchdog.progress()
    fetch_next_step(trainer, batches)  # while the device (or gloo) finishes the backward
    agreed = trainer.agreement.read(norm)  # one host read a step: the norm and the agreement
    trainer.late_loss.agreed(agreed.previous_loss_sum)  # the step before's, to the trackers
    step = trainer.pos.step = trainer.pos.step + 1
    trainer.late_loss.hold(step, step_loss, agreed.targets, trainer.optimizer.param_groups[0]["lr"])
    if update(trainer, step, step_loss, agreed.grad_norm):
        window.add_loss(step_loss, targets)
    window.targets += agreed.targets
    window.samples += trainer.global_batch
    window.steps += 1
    return agreed.signal


class StepBatches:
    """An epoch's batches (``iterator``, the loader's), of which the next step's can be
    fetched early (``fetch_ahead``): ``next`` returns those first, in the loader's order.

    Why: a step reads its gradient's norm on the host (the skip decision), which waits for
    the device to finish the backward. A plain loop never waits, so its host fetches the next
    batch while the device computes; fetched before that read, refddp's does too.

    Fetched early, a batch is the one it would have been, drawn from the same random states:
    which batch depends on the sampler's position only; torch's draws in a dataset's
    ``__getitem__`` on (seed, epoch, index) (``SeededFetch``); and where a user's dataset is
    fetched in this process (``--num-workers 0``: ``draws_here``), Python's and numpy's
    global states, which it may draw from, are put back as they were after the early fetch
    and moved on to where it left them when its batches are taken, as if fetched then (a
    cost of ~20-200 us a step, so not paid where nothing can draw). So a checkpoint saved in
    between holds the states from before the fetch, and a resumed run, which fetches the
    batch then, draws what the uninterrupted run drew (``fetch_next_step`` fetches nothing before an
    evaluation, which may draw too). A fetch that fails is raised where it would have been,
    at the next step's ``next``: the step fetched ahead of still updates."""

    def __init__(self, iterator: Any, draws_here: bool):
        self.iterator, self.draws_here = iterator, draws_here
        self.ahead: collections.deque[Any] = collections.deque()
        self.failed: Exception | None = None  # raised once the batches before it are taken
        self.states_after: tuple[Any, Any] | None = None  # Python's and numpy's, set at take

    def __iter__(self) -> StepBatches:
        return self

    def __next__(self) -> Any:
        if self.states_after is not None:  # the fetch ahead happens now, for the RNGs
            host_random.set_states(self.states_after)
            self.states_after = None
        if self.ahead:
            return self.ahead.popleft()
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed
        return next(self.iterator)

    def fetch_ahead(self, count: int) -> None:
        """Fetch ``count`` batches now; an error (StopIteration too) waits for its turn."""
        before = host_random.states() if self.draws_here else None
        try:
            for _ in range(count):
                self.ahead.append(next(self.iterator))
        except Exception as error:  # noqa: BLE001 (re-raised by __next__, in order)
            self.failed = error
        if before is not None:
            self.states_after = host_random.states()
            host_random.set_states(before)


def fetch_next_step(trainer: Any, batches: StepBatches) -> None:
    """Fetch the next step's micro-batches now (``StepBatches``), unless this step ends the
    epoch or the run, where nothing would take them, or any other step an evaluation follows,
    which may draw from the random states the fetch would move on."""
    this_step = trainer.pos.step + 1  # (pos.step counts it after the read)
    if trainer.evaluates_after(this_step):
        return
    waited = time.perf_counter()
    batches.fetch_ahead(trainer.c.grad_accum)
    trainer.window.data_wait += time.perf_counter() - waited


def host_target_count(trainer: Any, micro_batches: list[Any]) -> int:
    """This rank's targets in ``micro_batches``, counted where the loader made them (on
    the host, before they move to the device): no device read."""
    return sum(int(trainer.objective.count(batch)) for batch in micro_batches)


def free_last_gradient(trainer: Any) -> None:
    """Free the last step's gradient (``set_to_none``) just before this step's first forward,
    as a plain loop's ``zero_grad`` does, not at the end of the last update: freed there, with
    nothing allocated until the next forward, the C allocator (glibc's) hands the freed top
    of its heap back to the kernel, and every step's forward and backward then fault those
    pages in again (~4,700 page faults a gpt2_cpu step more than a plain loop's, ~2% of its
    time: benchmarks/README.md). The gradient thus lives from a step's backward to the next
    step's start, through an evaluation or a save between them, as in a plain loop; ``fit``
    frees the last one."""
    trainer.optimizer.zero_grad(set_to_none=True)


def stop_every_rank(trainer: Any, said: str) -> None:
    """End the run on every rank with ``said`` (each calls this alike, from values they
    share): recorded for the launcher's one line, then raised as ``NonFiniteStep``."""
    recorded = record_error(said, AGREED_STOP)
    if trainer.several:  # every rank is here: none exits before all have recorded
        dist.barrier()
    raise NonFiniteStep(said, recorded=recorded)


def end_if_nothing_trained(trainer: Any) -> None:
    """A run that reached its end having skipped every step fails there, on every rank alike
    (``skips.trained_nothing``), after its final evaluation and checkpoint: a rerun finds the
    same and fails again."""
    pos = trainer.pos
    why = skips.trained_nothing(pos.step, pos.skipped_in_a_row)
    if why:
        stop_every_rank(trainer, f"step {pos.step}: {why}")


def settle_ddp_buckets(trainer: Any, batch: Any) -> None:
    """One backward of a zero loss on ``batch`` before this invocation's first step, so
    that every step of every run, fresh or resumed, all-reduces its gradient in DDP's
    rebuilt bucket layout (why: ``Parallel.first_backward_rebuilds``). It leaves nothing
    behind: its gradient is dropped, the buffers its forward changed are put back, and
    the random streams it drew from (dropout) are as they were."""
    started = time.perf_counter()
    trainer.before_step.take()
    on_host = trainer.device.type == "cpu"  # (the CPU's stream is forked always)
    with torch.random.fork_rng(devices=[] if on_host else [trainer.device],
                               device_type="cuda" if on_host else trainer.device.type):
        loss = trainer.micro_loss(trainer.forward, on_device(trainer, batch))
        (loss.total * 0).backward()
    trainer.model.zero_grad(set_to_none=True)  # (parameters outside the optimizer too)
    trainer.before_step.restore()
    trainer.bucket_layout_pending = False
    trainer.window.exclude(started)  # a start cost, not training


def on_device(trainer: Any, batch: Any) -> Any:
    """``batch`` on this rank's device (on the CPU it is where the loader made it)."""
    return to_device(batch, trainer.device) if trainer.moves_batches else batch


def loss_scale(trainer: Any, dtype: torch.dtype) -> torch.Tensor:
    """What a micro-batch's loss sum (of ``dtype``) is multiplied by before its backward:
    world size / the global batch's target count. DDP averages gradients over ranks, so
    the gradient applied is then the sum over every target of the global batch divided by
    their count, at any world size and accumulation split (0 if the batch has no target).
    In float32 at least, whatever the loss's dtype."""
    dtype = torch.promote_types(dtype, torch.float32)
    if trainer.objective.counts_samples:  # one target a sample: the count is the global batch
        return sample_scale(trainer, dtype)
    count = trainer.agreement.targets()  # waits for the agreed count (in flight since the start)
    return torch.where(count > 0, trainer.ctx.world_size / count, 0.0).to(dtype)


def sample_scale(trainer: Any, dtype: torch.dtype) -> torch.Tensor:
    """``loss_scale`` where every sample is one target: world size / global batch, made
    once per dtype (a tensor made from a float each step would be a host-to-device copy,
    which waits for the device)."""
    if dtype not in trainer.sample_scales:
        trainer.sample_scales[dtype] = torch.tensor(trainer.ctx.world_size / trainer.global_batch,
                                                    dtype=dtype, device=trainer.device)  # fmt: skip
    return trainer.sample_scales[dtype]


def update(trainer: Any, step: int, step_loss: torch.Tensor, norm: float) -> bool:
    """Apply step ``step``'s update unless the gradient's ``norm`` (the same on every rank)
    is non-finite: then skip it on every rank alike (``skip_step``). True if applied."""
    applied = math.isfinite(norm)
    if applied:
        # Not GradScaler.step, which reads its own overflow check on the host: the norm,
        # read already, says the gradient is finite.
        trainer.optimizer.step()
        if trainer.scaling:
            trainer.scaler.update()  # GradScaler's growth count
    if not applied:
        skip_step(trainer, step, step_loss, norm)
        return False
    trainer.pos.skipped_in_a_row = 0
    trainer.schedule.advance(trainer.pos.updates)  # the rate of the next update
    return True


def skip_step(trainer: Any, step: int, step_loss: torch.Tensor, norm: float) -> None:
    """Step ``step`` is not applied (every rank is here alike): the buffers its forward
    changed are put back, GradScaler backs off for an overflow, the skip is counted and
    recorded, and the run ends if it trains nothing (refddp/training/skips.py); its gradient
    is freed. Only the data position has advanced."""
    shared, own = trainer.parallel.checked_alike()
    ctx = trainer.ctx  # one collective, which every rank makes:
    found = where_nonfinite(step_loss, shared, own, ctx.rank, ctx.world_size)
    trainer.before_step.restore()
    free_last_gradient(trainer)  # its non-finite gradient goes now, not at the next step
    overflow = None
    if trainer.scaling:
        overflow = skips.end_scaler_iteration(trainer.scaler, bool(found.bad_ranks))
    pos = trainer.pos
    pos.skipped_steps += 1
    pos.skipped_in_a_row += 1
    ends = skips.run_ends(trainer.c, pos.skipped_in_a_row, overflow)
    why = skips.cause(found, ctx.world_size, norm, overflow, ending=bool(ends))
    trainer.trackers.skipped(step, why, pos.skipped_steps)
    if ends:
        stop_every_rank(trainer, f"step {step}: {why}; stopping every rank ({ends})")
    if trainer.ctx.is_main:
        log.warning("step %d: %s; update skipped on every rank", step, why)
