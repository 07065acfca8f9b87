"""The training loop, one rank's view, with its checkpoints and resume.

Every rank runs this code in lock step. Rank-0-only work (progress bar, logging, files) never
contains a collective; anything every rank must agree on goes through one collective that
every rank reaches (``agree_any``, ``rank0_then_meet``, the metric all-reduce).
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from refddp import checkpoint as ckpt
from refddp.config import ConfigError, TrainConfig, per_rank_batch_size, save_yaml
from refddp.data import GlobalBatchSampler, build_datasets, make_loader
from refddp.dist import DistContext, HangWatchdog, agree_any, rank0_then_meet
from refddp.evaluation import autocast, evaluate
from refddp.models import build_model, count_parameters
from refddp.sync_batchnorm import convert_sync_batchnorm

log = logging.getLogger("refddp")

# bf16 dense peak FLOP/s by device name, for MFU (public spec-sheet numbers).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,
    "RTX 4090": 165e12,
}


class NonFiniteLoss(RuntimeError):
    """A rank's loss was inf/nan and ``on_nonfinite`` is ``stop``."""


class StopRequest:
    """SIGTERM/SIGINT set a flag; ranks agree on it at the next step and stop together."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

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


@dataclass
class Position:
    """Where training is; saved in every checkpoint so resume continues exactly here."""

    epoch: int = 0
    step: int = 0  # optimizer steps done (global batches consumed)
    samples_in_epoch: int = 0  # of this epoch's global order
    best_val_loss: float = math.inf
    metrics: dict[str, Any] = field(default_factory=dict)


def lr_factor(c: TrainConfig, total_steps: int) -> Any:
    def factor(step: int) -> float:
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.lr_schedule == "constant":
            return 1.0
        progress = (step - c.warmup_steps) / max(1, total_steps - c.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def build_optimizer(model: nn.Module, c: TrainConfig) -> torch.optim.Optimizer:
    if c.optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay
        )
    return torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=c.weight_decay)


def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift per rank during training)."""
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _append_history(c: TrainConfig, record: dict[str, Any]) -> None:
    path = os.path.join(c.out, "history.jsonl")
    with ckpt.writing(path), open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def prepare_run_dir(c: TrainConfig) -> None:
    os.makedirs(c.out, exist_ok=True)
    save_yaml(c, os.path.join(c.out, "config.yaml"))


def truncate_history(out: str, step: int) -> None:
    """Drop evaluations past ``step`` (a resume will redo them)."""
    path = os.path.join(out, "history.jsonl")
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [ln for ln in f if ln.strip() and json.loads(ln).get("step", 0) <= step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


class Trainer:
    """One rank's training run; ``fit()`` is the loop."""

    def __init__(self, c: TrainConfig, ctx: DistContext, watchdog: HangWatchdog | None = None):
        self.c, self.ctx, self.watchdog = c, ctx, watchdog
        self.device = torch.device(ctx.device)
        rank0_then_meet(lambda: prepare_run_dir(c))
        self.model = build_model(c).to(self.device)
        if c.sync_bn:  # batch statistics over the global batch: refddp/sync_batchnorm.py
            self.model = convert_sync_batchnorm(self.model)
        self.train_set, self.val_set = build_datasets(c)
        self.batch_size = per_rank_batch_size(c, ctx.world_size)
        self.global_batch = self.batch_size * ctx.world_size * c.grad_accum
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
        epoch_steps = c.epochs * self.sampler.steps_per_epoch
        self.total_steps = min(epoch_steps, c.max_steps) if c.max_steps else epoch_steps
        self.optimizer = build_optimizer(self.model, c)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(c, self.total_steps)
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=c.amp == "fp16")
        self.pos = Position()
        self.stop = StopRequest()
        self.skipped_steps = 0
        self.resumed_from = self._resume()
        if self.resumed_from:
            rank0_then_meet(lambda: truncate_history(c.out, self.pos.step))
        # DDP broadcasts rank 0's parameters and buffers here, so every replica starts equal.
        self.ddp = DDP(
            self.model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=c.find_unused_parameters,
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy
        )
        self.forward = torch.compile(self.ddp) if c.compile else self.ddp

    # -- checkpoints -------------------------------------------------------------------------

    def _resume(self) -> str | None:
        resumed = ckpt.load_resume_checkpoint(self.c)
        if resumed is None:
            return None
        path, state = resumed
        ckpt.load_model_weights(self.model, state, path)
        self.optimizer.load_state_dict(state["optimizer_state_dict"])
        if state.get("scheduler_state_dict"):
            self.scheduler.load_state_dict(state["scheduler_state_dict"])
        self.scaler.load_state_dict(state["scaler_state_dict"])
        self.pos = Position(
            epoch=state["epoch"],
            step=state["step"],
            samples_in_epoch=state.get("samples_in_epoch", 0),
            best_val_loss=state.get("best_val_loss", math.inf),
            metrics=state["metrics"],
        )
        if self.pos.samples_in_epoch % self.global_batch:
            raise ckpt.CheckpointError(
                f"{path}: stopped mid-epoch after {self.pos.samples_in_epoch} samples, which is "
                f"not a whole number of global batches of {self.global_batch}; resume with the "
                "same global_batch_size"
            )
        rng = state.get("rng_states") or []
        if len(rng) == self.ctx.world_size:
            ckpt.set_rng_state(rng[self.ctx.rank])
        else:  # another world size: a fresh, still deterministic, stream per rank
            torch.manual_seed(self.c.seed + 7919 * self.pos.step + self.ctx.rank)
        log.info("resumed from %s at epoch %d, step %d", path, self.pos.epoch, self.pos.step)
        return path

    def save(self, is_best: bool = False) -> None:
        """Every rank gathers its RNG state; rank 0 writes; all meet before going on."""
        if self.model_has_buffers:
            sync_buffers(self.model)
        rng_states: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(rng_states, ckpt.rng_state())
        state = {
            "format_version": ckpt.FORMAT_VERSION,
            "model_state_dict": ckpt.unwrap(self.model).state_dict(),
            "optimizer_state_dict": self.optimizer.state_dict(),
            "scheduler_state_dict": self.scheduler.state_dict(),
            "scaler_state_dict": self.scaler.state_dict(),
            "epoch": self.pos.epoch,
            "step": self.pos.step,
            "samples_in_epoch": self.pos.samples_in_epoch,
            "best_val_loss": self.pos.best_val_loss,
            "world_size": self.ctx.world_size,
            "config": self.c.to_dict(),
            "metrics": self.pos.metrics,
            "rng_states": rng_states,
        }
        rank0_then_meet(lambda: ckpt.write_checkpoint(state, self.c.out, is_best))
        if self.watchdog:
            self.watchdog.progress()

    @property
    def model_has_buffers(self) -> bool:
        return any(True for _ in self.model.buffers())

    # -- evaluation --------------------------------------------------------------------------

    def new_window(self) -> dict[str, Any]:
        """What is measured between two evaluations."""
        return {"start": time.perf_counter(), "samples": 0, "steps": 0, "data_wait": 0.0,
                # [sum of step losses, steps taken]: on the device, summed over ranks at eval
                "loss": torch.zeros(2, dtype=torch.float64, device=self.device)}  # fmt: skip

    def evaluate_and_record(self, window: dict[str, Any]) -> bool:
        """Evaluate, log, append to history; True if this is the best validation loss so far."""
        elapsed = max(time.perf_counter() - window["start"], 1e-9)  # training time only
        if self.model_has_buffers:
            sync_buffers(self.model)
        metrics = evaluate(self.model, self.val_set, self.c, self.ctx, self.watchdog)
        train_loss = window["loss"]
        dist.all_reduce(train_loss)
        record = {
            "epoch": self.pos.epoch,
            "step": self.pos.step,
            "train_loss": train_loss[0].item() / max(train_loss[1].item(), 1),
            "val_loss": metrics["val_loss"],
            "val_acc": metrics["val_acc"],
            "samples_per_s": window["samples"] / elapsed,
            "step_time_s": elapsed / max(window["steps"], 1),
            "data_wait_share": window["data_wait"] / elapsed,
            "peak_memory_mb": peak_memory_mb(self.device),
        }
        mfu = self._mfu(record["samples_per_s"])
        if mfu is not None:
            record["mfu"] = mfu
        self.pos.metrics = {**record, "num_samples": metrics["num_samples"]}
        is_best = metrics["val_loss"] < self.pos.best_val_loss
        if is_best:
            self.pos.best_val_loss = metrics["val_loss"]
        rank0_then_meet(lambda: _append_history(self.c, record))
        if self.ctx.is_main:
            log.info(
                "epoch %d step %d: train_loss %.4f val_loss %.4f val_acc %.4f %.0f samples/s",
                record["epoch"],
                record["step"],
                record["train_loss"],
                record["val_loss"],
                record["val_acc"],
                record["samples_per_s"],
            )
        return is_best

    def _mfu(self, samples_per_s: float) -> float | None:
        if self.device.type != "cuda":
            return None
        name = torch.cuda.get_device_name(self.device)
        peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
        if peak is None:
            return None
        # ~6 FLOPs per parameter per sample (forward 2, backward 4) for dense layers.
        flops = 6 * count_parameters(self.model) * samples_per_s / self.ctx.world_size
        return flops / peak

    # -- the loop ----------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        with self.stop:
            return self._fit()

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
        # Created after every rank has passed DDP's construction; updated by rank 0 only.
        bar = tqdm(
            total=self.total_steps,
            initial=pos.step,
            disable=not (c.progress and ctx.is_main),
            desc="train",
            unit="step",
            dynamic_ncols=True,
            leave=False,
        )
        steps_this_run, stop_signal = 0, None
        window = self.new_window()
        self.ddp.train()
        while pos.step < self.total_steps and stop_signal is None:
            self.sampler.set_epoch(pos.epoch)  # a new shuffle each epoch, the same on every rank
            self.sampler.set_start(pos.samples_in_epoch)
            loader_seed = c.seed * 100_003 + pos.epoch * 1009 + ctx.rank
            loader = make_loader(
                self.train_set,
                self.sampler,
                self.batch_size,
                c,
                self.device.type == "cuda",
                loader_seed,
            )
            batches = iter(loader)
            epoch_end = (pos.epoch + 1) * self.sampler.steps_per_epoch
            # The epoch's (or the run's) last step is evaluated and saved after this loop.
            last_step = min(epoch_end, self.total_steps)
            while pos.step < last_step:
                step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
                for micro in range(c.grad_accum):
                    waited = time.perf_counter()
                    x, y = next(batches)
                    window["data_wait"] += time.perf_counter() - waited
                    x, y = (
                        x.to(self.device, non_blocking=True),
                        y.to(self.device, non_blocking=True),
                    )
                    # Only sync gradients at the last micro-step: earlier ones accumulate locally.
                    last = micro == c.grad_accum - 1
                    with (
                        self.ddp.no_sync() if not last else nullcontext(),
                        autocast(c, self.device),
                    ):
                        # Scale the loss so the accumulated gradient is the mean over the
                        # global batch (DDP then averages over ranks).
                        loss = F.cross_entropy(self.forward(x), y) / c.grad_accum
                    self.scaler.scale(loss).backward()
                    step_loss += loss.detach().double()
                # One small collective per step: every rank learns whether any rank saw a
                # non-finite loss or was asked to stop, so all take the same branch.
                nonfinite, stopping = agree_any(
                    not bool(torch.isfinite(step_loss)),
                    self.stop.signal is not None,
                    device=self.device,
                )
                if nonfinite:
                    if c.on_nonfinite == "stop":
                        raise NonFiniteLoss(
                            f"non-finite loss at step {pos.step + 1} on at least one rank; "
                            "stopping every rank (on_nonfinite=stop)"
                        )
                    self.skipped_steps += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    log.warning(
                        "step %d: non-finite loss, update skipped on every rank", pos.step + 1
                    )
                else:
                    if c.grad_clip:
                        self.scaler.unscale_(self.optimizer)  # clip the true gradient
                        nn.utils.clip_grad_norm_(self.model.parameters(), c.grad_clip)
                    self.scaler.step(self.optimizer)  # skips the step on inf/nan fp16 grads
                    self.scaler.update()
                    self.optimizer.zero_grad(set_to_none=True)
                    window["loss"] += torch.stack([step_loss, torch.ones_like(step_loss)])
                self.scheduler.step()
                pos.step += 1
                pos.samples_in_epoch += self.global_batch
                steps_this_run += 1
                window["samples"] += self.global_batch
                window["steps"] += 1
                bar.update(1)
                if self.watchdog:
                    self.watchdog.progress()
                if stopping:
                    stop_signal = self.stop.signal or signal.SIGTERM
                    break
                if c.stop_after and steps_this_run >= c.stop_after:
                    stop_signal = -1
                    break
                if c.eval_every and pos.step % c.eval_every == 0 and pos.step < last_step:
                    is_best = self.evaluate_and_record(window)
                    window = self.new_window()
                    self.save(is_best)
                elif c.ckpt_every and pos.step % c.ckpt_every == 0 and pos.step < last_step:
                    self.save()
            del batches, loader
            if stop_signal is not None:
                break
            if pos.step == epoch_end:
                pos.epoch += 1
                pos.samples_in_epoch = 0
            # End of an epoch or of max_steps: evaluate, then save what was evaluated.
            is_best = self.evaluate_and_record(window)
            window = self.new_window()
            self.save(is_best)
        bar.close()
        if stop_signal is not None:
            self.save()
            why = "stop_after reached" if stop_signal == -1 else signal.Signals(stop_signal).name
            log.info("stopped at step %d (%s); checkpoint saved, rerun to resume", pos.step, why)
        return {
            "step": pos.step,
            "epoch": pos.epoch,
            "stopped_by": stop_signal,
            "skipped_steps": self.skipped_steps,
            "metrics": pos.metrics,
        }
