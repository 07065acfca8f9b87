"""The training loop, one rank's view, with its evaluations, checkpoints and resume.

Every rank runs this code in lock step. Rank-0-only work (progress bar, logging, files) never
contains a collective; anything every rank must agree on goes through one collective that
every rank reaches (``StepAgreement``, ``rank0_then_meet``, the metric all-reduce). One step
lives in ``steps.py``, the optimizer and the run directory in ``run_setup.py``; what a
checkpoint holds and how it is restored, in ``run_state.py``.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from refddp.checkpoints import formats as checkpoint_formats
from refddp.checkpoints import loading as ckpt
from refddp.checkpoints import run_files, run_state
from refddp.checkpoints.run_files import checkpoint_dir
from refddp.checkpoints.run_state import CheckpointError, rng_state
from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import list_items, per_rank_batch_size
from refddp.launch.dist import DistContext, rank0_then_meet
from refddp.launch.stop_signals import StopRequest
from refddp.training import run_setup, steps, trackers
from refddp.training.evaluation import agreed_objective, autocast, evaluate, finite_validation
from refddp.training.metrics import describe_record, model_flops_utilisation, peak_memory_mb
from refddp.training.parallel import build_parallel, sync_buffers, unused_parameters_line
from refddp.training.profiler import StepProfiler
from refddp.training.schedule import Schedule
from refddp.training.skips import BufferSnapshot
from refddp.training.step_agreement import LateLoss, StepAgreement
from refddp.training.stragglers import (
    StragglerWatch,
    ranks_per_node,
    straggler_fields,
    times_vector,
)
from refddp.training.sync_batchnorm import convert_sync_batchnorm
from refddp.training.trackers.base import Run, Trackers
from refddp.training.watchdog import HangWatchdog
from refddp.training.window import Window
from refddp.workload.data import GlobalBatchSampler, TensorPairDataset, build_datasets, make_loader
from refddp.workload.models import build_model, count_parameters

log = logging.getLogger("refddp")


class Trainer:
    """One rank's training run; ``fit()`` is the loop."""

    def __init__(self, c: TrainConfig, ctx: DistContext, watchdog: HangWatchdog | None = None):
        self.c, self.ctx, self.watchdog = c, ctx, watchdog
        self.device = torch.device(ctx.device)
        rank0_then_meet(lambda: run_setup.prepare_run_dir(c))
        self.model = build_model(c).to(self.device)
        self.train_set, self.val_set = build_datasets(c)
        self.objective = agreed_objective(c, self.model, self.train_set, ctx)
        if c.sync_bn:  # batch statistics over the global batch: refddp/training/sync_batchnorm.py
            self.model = convert_sync_batchnorm(self.model)
        self.batch_size = per_rank_batch_size(c, ctx.world_size)
        self.global_batch = self.batch_size * ctx.world_size * c.grad_accum
        self.loader: Any = None  # the training loader (epoch_batches)
        self.sampler = GlobalBatchSampler(
            self.train_set, ctx.world_size, ctx.rank, self.global_batch, c.seed
        )
        if self.sampler.steps_per_epoch == 0:
            raise ConfigError(
                f"data: {len(self.train_set)} training samples do not fill one global batch of "
                f"{self.global_batch} (batch_size x world size x grad_accum)"
            )
        # A user dataset that differs between ranks would desynchronise the step count: refuse.
        low, high = -self.sampler.steps_per_epoch, self.sampler.steps_per_epoch
        extremes = torch.tensor([low, high], dtype=torch.float64, device=self.device)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        if -extremes[0].item() != extremes[1].item():
            raise ConfigError(
                f"data: ranks see different training set sizes ({int(-extremes[0])} to "
                f"{int(extremes[1])} steps per epoch); every rank must load the same dataset"
            )
        self.total_steps = run_state.total_steps(c, self.sampler.steps_per_epoch)
        if c.init_from:  # weights only, read by rank 0: the wrapper below gives them to all
            rank0_then_meet(lambda: ckpt.load_model_weights(
                self.model, ckpt.load_checkpoint(c.init_from), c.init_from))  # fmt: skip
        # DDP (or FSDP) starts every replica from rank 0's parameters and buffers.
        self.parallel = build_parallel(self.model, c, ctx)
        self.forward = self.parallel.module
        fused = run_setup.fuses_on_cuda(c, self.device)
        self.optimizer = run_setup.build_optimizer(self.model, c, fused)  # after FSDP's sharding
        self.before_step = BufferSnapshot(self.model)  # put back when a step is skipped
        # Once per invocation, before its first step (``settle_ddp_buckets``).
        self.bucket_layout_pending = self.parallel.first_backward_rebuilds
        self.schedule = Schedule(self.optimizer, c, self.total_steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=c.amp == "fp16")
        self.scaling = self.scaler.is_enabled()
        # A micro-batch's loss (forward, then the objective), under AMP's autocast when it is
        # on: one context, made once and entered once per micro-batch (never nested: it is
        # not re-entrant; evaluation makes its own).
        self.micro_loss = self.objective.batch_loss
        if c.amp != "off":
            self.micro_loss = autocast(c, self.device)(self.micro_loss)
        self.moves_batches = self.device.type != "cpu"
        self.parts = run_state.RunParts(self.parallel, self.optimizer, self.schedule, self.scaler)
        self.pos = run_state.Position()
        self.stop = StopRequest()
        self.stopped_by: int | None = None  # the signal that stopped this invocation, if any
        self.agreement = StepAgreement(self.stop, self.device, ctx.world_size, c.stop_check_s)
        self.several = ctx.world_size > 1  # ranks to agree with, and to wait for
        self.sample_scales: dict[torch.dtype, torch.Tensor] = {}  # sample_scale's
        self.resumed_from = self._resume()
        # (refddp's launcher refused it already; under plain torchrun or srun it is refused here)
        run_state.refuse_an_end_behind(c, self.pos.step, self.total_steps, self.resumed_from)
        self.window = self.open_window(self.pos.window)
        # Rank 0's trackers (--log-to; history.jsonl always), continuing from this step; the
        # other ranks hold none, so the calls below need no rank check.
        run = Run(c.out, c.to_dict(), self.pos.step, resumed=bool(self.resumed_from))
        self.trackers = rank0_then_meet(lambda: Trackers.open(list_items(c.log_to), run))
        self.trackers = self.trackers or Trackers()
        # Every rank alike (the step's agreement carries a logged step's loss): the per-step
        # loss goes to any tracker named besides history.jsonl, which takes evaluations and skips.
        logs_steps = any(name != trackers.ALWAYS for name in list_items(c.log_to))
        self.late_loss = LateLoss(self.trackers, c.log_every if logs_steps else 0)
        self.stragglers = StragglerWatch(ranks_per_node(ctx.world_size))  # a slow node named

    # -- checkpoints -------------------------------------------------------------------------

    def _resume(self) -> str | None:
        """Every rank continues from rank 0's checkpoint (with ``--out`` on node-local disks the
        others may have none), or from ``init_from``'s weights, or from scratch."""
        c, ctx = self.c, self.ctx
        mine = ckpt.load_resume_checkpoint(c)
        found: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(found, mine and (mine[0], mine[1]["step"]))
        if any(f is not None and (found[0] is None or f[1] != found[0][1]) for f in found[1:]):
            seen = "; ".join(
                f"rank {r}: " + (f"step {f[1]} in {f[0]}" if f else f"none in {c.out}")
                for r, f in enumerate(found)
            )
            raise CheckpointError(
                f"resume: ranks found different checkpoints ({seen}); every rank resumes from "
                "rank 0's: give rank 0 the checkpoint (a shared --out, or --resume PATH)"
            )
        # A fresh run's first save finds an earlier run's checkpoints in --out, if any (``save``).
        self.saves_fresh = found[0] is None  # (every rank alike: rank 0's, gathered)
        if self.saves_fresh and c.init_from and run_files.is_within(c.init_from,
                                                                    checkpoint_dir(c.out)):
            raise ConfigError(
                f"init_from: {c.init_from} is in {checkpoint_dir(c.out)}, whose checkpoints this "
                "fresh run replaces at its first save; copy it out of --out first, or give "
                "another --out"
            )
        shared = [mine if ctx.is_main else None]
        if found[0] is not None and ctx.world_size > 1:
            dist.broadcast_object_list(shared, src=0)
        if shared[0] is None:
            if c.init_from:
                log.info("initialised from the weights of %s", c.init_from)
            return None
        path, state = shared[0]
        self.pos = run_state.restore(state, path, self.parts, c, ctx.rank, ctx.world_size,
                                self.global_batch, self.sampler.steps_per_epoch)  # fmt: skip
        log.info("resumed from %s at epoch %d, step %d", path, self.epoch, self.pos.step)
        return path

    def save(self, is_best: bool = False) -> int:
        """Every rank sends its RNG state and loss window; rank 0 writes; all meet.

        Returns the stop signal any rank has received by then (0: none): a save, however long,
        is a point where a stop request is honoured.
        """
        if self.model_has_buffers:
            sync_buffers(self.model)
        per_rank: list[Any] = [None] * self.ctx.world_size
        mine = {"rng": rng_state(), "loss": self.window.local_loss()}
        dist.all_gather_object(per_rank, mine)
        self.pos.window = self.window.saved()
        fmt = checkpoint_formats.named(self.c.ckpt_format)  # full: rank 0 writes; dcp: all
        self.trackers.flush()  # what they logged up to here survives a kill: resume goes on
        state = run_state.build_state(self.parts, self.pos, self.c, self.global_batch,
                                      self.sampler.steps_per_epoch, per_rank,
                                      tensors=fmt.GATHERS_TENSORS)  # fmt: skip
        fmt.write(state, self.parts, self.c.out, is_best)
        fresh, self.saves_fresh = self.saves_fresh, False
        if fresh:  # none of an earlier run's checkpoints is left to be taken for this run's
            directory = checkpoint_dir(self.c.out)
            rank0_then_meet(lambda: checkpoint_formats.forget_earlier_run(fmt, directory, is_best))
        if self.watchdog:
            self.watchdog.progress()
        return self.settle()

    @property
    def model_has_buffers(self) -> bool:
        return any(True for _ in self.model.buffers())

    @property
    def epoch(self) -> int:
        return self.pos.step // self.sampler.steps_per_epoch

    # -- evaluation --------------------------------------------------------------------------

    def evaluate_and_record(self) -> tuple[bool, bool]:
        """Evaluate, log, append to history: (best validation loss so far?, interrupted?).

        A stop request on any rank interrupts the evaluation; nothing is then recorded.
        """
        w = self.window
        elapsed = max(w.elapsed(), 1e-9)  # training only
        if self.model_has_buffers:
            sync_buffers(self.model)
        metrics = evaluate(self.model, self.val_set, self.c, self.ctx, self.watchdog,
                           stop=lambda: self.stop.signal is not None,
                           objective=self.objective)  # fmt: skip
        if metrics.pop("interrupted"):
            return False, True
        # Each rank's compute and data wait ride along (refddp/training/stragglers.py): no
        # collective of their own.
        own_times = times_vector(w, self.ctx.rank, self.ctx.world_size, self.device)
        train = torch.cat([w.loss_tensor(), own_times])
        dist.all_reduce(train)  # sums over ranks: the mean over every target trained on
        loss_sum, loss_targets, *rank_times = train.tolist()
        record = {
            "epoch": self.epoch,
            "step": self.pos.step,
            "train_loss": loss_sum / loss_targets if loss_targets else math.nan,
            **{k: v for k, v in metrics.items() if k.startswith("val_")},
            "samples_per_s": w.samples / elapsed,
            "targets_per_s": w.targets / elapsed,
            "step_time_s": elapsed / max(w.steps, 1),
            "data_wait_share": w.data_wait / elapsed,
            "peak_memory_mb": peak_memory_mb(self.device),
            "skipped_steps": self.pos.skipped_steps,
        }
        per_s = record["targets_per_s" if self.objective.sequence else "samples_per_s"]
        mfu = model_flops_utilisation(self.model, self.device, per_s)
        if mfu is not None:
            record["mfu"] = mfu
        behind = straggler_fields(rank_times)
        record.update(behind)
        self.pos.metrics = {**record, "num_samples": metrics["num_samples"]}
        is_best = metrics["val_loss"] < self.pos.best_val_loss
        if is_best:
            self.pos.best_val_loss = metrics["val_loss"]
        rank0_then_meet(lambda: self.trackers.record(record))
        if self.ctx.is_main:
            log.info("epoch %d step %d: %s", record["epoch"], record["step"],
                     describe_record(record, self.objective.sequence))  # fmt: skip
            warning = self.stragglers.observe(behind)
            if warning:
                log.warning("step %d: %s", record["step"], warning)
        self.window = self.open_window()  # training time starts again (its log line is not)
        return is_best, False

    # -- the loop ----------------------------------------------------------------------------

    def open_window(self, saved: dict[str, Any] | None = None) -> Window:
        """A new measurement window (``saved``: one a checkpoint carried over)."""
        return Window.open(self.device, saved)

    def epoch_batches(self) -> Any:
        """This epoch's batches from the current position on (a resume starts mid-epoch).

        One loader serves the run; each epoch sets its shuffle, its samples' seeds and its
        workers' seeds, as a loader made for the epoch would have them."""
        c, ctx, pos = self.c, self.ctx, self.pos
        self.sampler.set_epoch(self.epoch)  # a new shuffle each epoch, the same on every rank
        self.sampler.set_start(pos.step % self.sampler.steps_per_epoch * self.global_batch)
        loader_seed = c.seed * 100_003 + self.epoch * 1009 + ctx.rank
        if self.loader is None:
            pin = self.device.type == "cuda"
            self.loader = make_loader(self.train_set, self.sampler, self.batch_size, c, pin,
                                      loader_seed)  # fmt: skip
        else:
            self.loader.dataset.epoch = self.epoch  # the samples' seeds (SeededFetch)
            self.loader.generator.manual_seed(loader_seed)  # the workers' seeds
        # A user's dataset fetched in this process may draw from Python's and numpy's RNGs.
        draws_here = c.num_workers == 0 and not isinstance(self.train_set, TensorPairDataset)
        return steps.StepBatches(iter(self.loader), draws_here)

    def train_step(self, batches: Any) -> int:
        """One training step (``refddp/training/steps.py``): forward and backward over
        ``grad_accum`` micro-batches, then the update unless the gradient is non-finite.
        Returns the stop signal any rank had received when the step began, where the step met
        (0: none, or the step did not meet)."""
        try:
            return steps.train_step(self, batches)
        except RuntimeError as exc:  # DDP's long error for unused parameters: one line
            unused = unused_parameters_line(exc, getattr(self.parallel, "wrapped", self.model))
            if unused is None or self.c.find_unused_parameters:  # (then DDP's own words)
                raise
            raise ConfigError(unused) from None

    def settle(self) -> int:
        """Agree now on what waits for the next step's all-reduce: the last step's loss (for
        the trackers) and a stop signal received since the ranks last met. Every rank calls it at
        the same points (an evaluation, a checkpoint, a stop); returns the signal (0: none)."""
        agreed = self.agreement.settle(self.late_loss.to_send())
        self.late_loss.agreed(agreed.previous_loss_sum)
        return agreed.signal

    def evaluates_after(self, step: int) -> bool:
        """Whether ``end_of_step`` evaluates after step ``step``: an epoch's or the run's last,
        every ``eval_every``, or one a stop deferred."""
        c = self.c
        return (
            self.pos.eval_pending
            or step == self.total_steps
            or step % self.sampler.steps_per_epoch == 0
            or bool(c.eval_every and step % c.eval_every == 0)
        )

    def end_of_step(self, signum: int, steps_this_run: int) -> bool:
        """Evaluate, save and stop, decided in one place; True when this invocation stops.

        A stop signal defers a due evaluation: the checkpoint marks it pending and the resumed
        run does it first. ``stop_after`` lets it run, so the stop loses nothing.
        """
        c, step = self.c, self.pos.step
        eval_due = self.evaluates_after(step)
        stop_after = bool(c.stop_after) and steps_this_run >= c.stop_after
        stop_after = stop_after and step < self.total_steps
        due = eval_due or stop_after or bool(c.ckpt_every and step % c.ckpt_every == 0)
        if due or signum:  # the last step's loss and a late stop signal are agreed first
            signum = self.settle() or signum
        if not (due or signum):
            return False
        is_best, interrupted = False, bool(signum)
        if eval_due and not interrupted:
            is_best, interrupted = self.evaluate_and_record()
        self.pos.eval_pending = eval_due and interrupted
        saving = time.perf_counter()
        signum = self.save(is_best)  # every rank learns here of a stop requested anywhere
        self.window.exclude(saving)  # throughput counts training only
        if signum:
            self.stopped_by = signum
        return bool(signum) or stop_after

    def fit(self) -> dict[str, Any]:
        with self.stop:
            try:
                return self._fit()
            except BaseException:
                self.trackers.close_failed()  # what was logged stays; W&B marks the run failed
                raise
            finally:
                steps.free_last_gradient(self)  # the model is handed back without one

    def _fit(self) -> dict[str, Any]:
        c, ctx, pos = self.c, self.ctx, self.pos
        if ctx.is_main:
            log.info(
                "training %s (%d parameters) on %d rank(s) [%s, %s], global batch %d "
                "(%d per rank x %d accumulation), %d steps per epoch, %d steps in all",
                c.model,
                count_parameters(self.model),
                ctx.world_size,
                ctx.backend,
                ctx.device,
                self.global_batch,
                self.batch_size,
                c.grad_accum,
                self.sampler.steps_per_epoch,
                self.total_steps,
            )
            log.info("loss: %s", self.objective.describe())
        # Created after every rank has passed DDP's construction; updated by rank 0 only.
        bar = tqdm(total=self.total_steps, initial=pos.step, desc="train", unit="step",
                   disable=not (c.progress and ctx.is_main), dynamic_ncols=True,
                   leave=False)  # fmt: skip
        self.model.train()
        # A stop interrupted the evaluation due at this step: it runs first. So does the final
        # one where a resume starts at the run's end (``max_steps`` or ``epochs`` lowered to
        # the step a stopped run had reached) and the run has not evaluated there yet.
        at_its_end = (0 < pos.step == self.total_steps  # (a fresh run of 0 epochs: no)
                      and pos.metrics.get("step") != pos.step)  # fmt: skip
        stopping = (pos.eval_pending or at_its_end) and self.end_of_step(0, 0)
        profiler = StepProfiler(c.profile, c.out, ctx.rank, self.device) if c.profile else None
        if profiler is not None:
            profiler.after_step(pos.step)  # starts now if the window does
        steps_this_run, batches = 0, None
        while pos.step < self.total_steps and not stopping:
            if batches is None:  # the epoch (or this invocation) starts
                batches = self.epoch_batches()
            signum = self.train_step(batches)
            steps_this_run += 1
            bar.update(1)
            if pos.step % self.sampler.steps_per_epoch == 0:
                batches = None  # the epoch is over: its iterator and workers go (the loader stays)
            stopping = self.end_of_step(signum, steps_this_run)
            if profiler is not None:  # --profile START:END: refddp/training/profiler.py
                profiler.after_step(pos.step)
        del batches
        bar.close()
        if profiler is not None:
            profiler.finish()  # a run that stopped inside the window
        if not stopping:
            steps.end_if_nothing_trained(self)
        # A final evaluation that is not finite fails the run (refddp/train.py exits 1).
        if not stopping and not finite_validation(pos.metrics):
            rank0_then_meet(self.trackers.close_failed)
        else:
            rank0_then_meet(self.trackers.close)
        if stopping:
            why = signal.Signals(self.stopped_by).name if self.stopped_by else "stop_after reached"
            log.info("stopped at step %d (%s); checkpoint saved, rerun to resume", pos.step, why)
        return {
            "step": pos.step,
            "epoch": self.epoch,
            "stopped_by": self.stopped_by,
            "stopped": stopping,
            "skipped_steps": pos.skipped_steps,
            "metrics": pos.metrics,
        }
