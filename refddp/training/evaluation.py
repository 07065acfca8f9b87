"""Evaluation and prediction: every sample exactly once, at any world size.

Each rank runs the model over its unpadded shard; the objective's sums and counts then meet in
one all-reduce (eval) or one gather (predict). Under DDP the plain model runs (no collectives
while shards differ in length); under FSDP every forward gathers parameters, so ranks run the
same number of forwards, the ones past their shard's end counting nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from refddp.checkpoints import loading as ckpt
from refddp.checkpoints.run_files import torch_save, writing
from refddp.checkpoints.run_state import unwrap
from refddp.config.schema import ConfigError, TrainConfig
from refddp.launch.dist import DistContext, agree_any, rank0_then_meet
from refddp.training.parallel import runs_in_lockstep
from refddp.training.trackers.jsonl import strict_json
from refddp.training.watchdog import HangWatchdog
from refddp.workload.data import ShardSampler, build_datasets, make_loader
from refddp.workload.models import build_model
from refddp.workload.objectives import Objective, build_objective
from refddp.workload.objectives.batches import batch_size, first_batch, to_device


def autocast(c: TrainConfig, device: torch.device) -> Any:
    if c.amp == "off":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if c.amp == "fp16" else torch.bfloat16)


def finite_validation(metrics: dict[str, Any]) -> bool:
    """Whether a record's validation loss is finite (or there is none): a run whose final
    evaluation is not has failed (it exits 1, and its trackers close as failed). The loss
    alone: a metric made from it can overflow where it is finite (perplexity is inf from a
    loss of 700), and a user's metric may be infinite by design."""
    loss = metrics.get("val_loss")
    return not isinstance(loss, float) or math.isfinite(loss)


def agreed_objective(c: TrainConfig, model: nn.Module, dataset: Any, ctx: DistContext) -> Objective:
    """The run's objective, checked on a first batch on every rank; a problem any rank finds
    (a model output without a loss, targets of the wrong shape...) stops every rank, with the
    same one line, before any step. So do ranks whose first batches make objectives that count
    differently: whether a step must agree on its target count (``counts_samples``) decides
    whether it meets in the step's all-reduce, which every rank must decide alike."""
    device = torch.device(ctx.device)
    problem, objective = None, None
    try:
        objective = build_objective(c, model, dataset, device, lambda: autocast(c, device))
    except ConfigError as exc:
        problem = str(exc)
    if ctx.world_size > 1:
        mine = (problem, None if objective is None else objective.counts_samples)
        found: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(found, mine)
        problem = next((p for p, _ in found if p), None)
        per_sample = [rank for rank, (_, counts) in enumerate(found) if counts]
        if problem is None and 0 < len(per_sample) < ctx.world_size:
            problem = (
                f"loss: the ranks' first batches make different objectives: rank(s) "
                f"{per_sample} count one target a sample, the others count scored targets "
                "(padding, -100 labels or a loss of (sum, count)); give every rank data of one kind"
            )
    if problem is not None or objective is None:
        raise ConfigError(problem or "loss: the objective could not be built")
    return objective


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Any,
    c: TrainConfig,
    ctx: DistContext,
    watchdog: HangWatchdog | None,
    stop: Callable[[], bool] | None = None,
    objective: Objective | None = None,
) -> dict[str, Any]:
    """The objective's metrics over every validation sample exactly once, at any world size.

    ``stop()`` true on any rank ends the evaluation early on that rank; the all-reduce every
    rank meets at tells them all, and the result says ``interrupted`` instead of metrics.
    """
    device = torch.device(ctx.device)
    model = unwrap(model)  # plain forward: no DDP collectives while shards differ in length
    if objective is None:
        objective = agreed_objective(c, model, dataset, ctx)
    extra = objective.user_metrics
    names = objective.sum_names + (extra.sum_names if extra is not None else ())
    lockstep = runs_in_lockstep(model)  # FSDP: each forward gathers parameters from every rank
    was_training = model.training
    model.eval()
    # The objective's sums, the user's, then samples and a stop flag: one all-reduce.
    sums = torch.zeros(len(names) + 2, dtype=torch.float64, device=device)
    sampler = ShardSampler(len(dataset), ctx.world_size, ctx.rank)
    loader = make_loader(dataset, sampler, c.batch_size, c, device.type == "cuda", c.seed)
    # In lockstep every rank runs as many forwards as the longest shard (rank 0's) needs; a
    # rank past its shard's end repeats its last batch and counts nothing.
    forwards = -(-len(range(0, len(dataset), ctx.world_size)) // c.batch_size)
    batches, filler, done = iter(loader), None, 0
    while not lockstep or done < forwards:
        batch = next(batches, None)
        if batch is None and not lockstep:
            break
        done += 1
        stopping = stop is not None and stop()
        if lockstep:  # every rank must leave the loop at the same forward
            stopping = agree_any(stopping, device=device)[0]
        if stopping:
            sums[-1] = 1
            break
        counted = batch is not None
        batch = batch if counted else filler if filler is not None else first_batch(dataset, 1)
        filler = batch
        batch = to_device(batch, device)
        with autocast(c, device):
            outputs = objective.forward(model, batch)
        if not counted:
            continue
        found = objective.eval_sums(outputs, batch)
        if extra is not None:
            found += extra.eval_sums(outputs, batch)
        for i, value in enumerate(found):
            sums[i] += value
        sums[-2] += batch_size(batch)
        if watchdog:
            watchdog.progress()
    dist.all_reduce(sums)  # sums and counts, not means: exact with uneven shards
    model.train(was_training)
    *values, samples, stopped = sums.tolist()
    if stopped:
        return {"interrupted": True}
    totals = dict(zip(names, values, strict=True))
    metrics = objective.metrics(totals)
    if extra is not None:
        metrics.update(extra.metrics(totals))
    targets = totals.get("targets", samples)
    return {**metrics, "num_samples": int(samples), "num_targets": int(targets),
            "interrupted": False}  # fmt: skip


def load_for_inference(c: TrainConfig, ctx: DistContext) -> tuple[nn.Module, str]:
    """The model with the weights of the checkpoint ``resume`` names, for eval and predict."""
    path, state = ckpt.load_resume_checkpoint(c)  # type: ignore[misc]  # never None here
    model = build_model(c)
    ckpt.load_model_weights(model, state, path)
    return model.to(ctx.device), path


def run_eval(c: TrainConfig, ctx: DistContext) -> dict[str, Any]:
    model, path = load_for_inference(c, ctx)
    _, val = build_datasets(c)
    metrics = evaluate(model, val, c, ctx, None)
    metrics.pop("interrupted")
    result = {**metrics, "checkpoint": path}

    def write() -> None:
        path = os.path.join(c.out, "eval.json")
        with writing(path), open(path, "w") as f:
            f.write(strict_json(result, indent=2))

    rank0_then_meet(write)
    return result


@torch.no_grad()
def run_predict(c: TrainConfig, ctx: DistContext) -> dict[str, Any]:
    """Predict the validation set; rank 0 writes what the model output for each sample, in
    dataset order (the objective says what: classes keep ``logits`` and ``prediction``)."""
    model, checkpoint = load_for_inference(c, ctx)
    _, val = build_datasets(c)
    objective = agreed_objective(c, model, val, ctx)
    model.eval()
    device = torch.device(ctx.device)
    sampler = ShardSampler(len(val), ctx.world_size, ctx.rank)
    loader = make_loader(val, sampler, c.batch_size, c, False, c.seed)
    found: dict[str, list[torch.Tensor]] = {}
    for batch in loader:
        batch = to_device(batch, device)
        for name, value in objective.predictions(objective.forward(model, batch), batch).items():
            found.setdefault(name, []).append(value)
    local = {"index": torch.tensor(list(sampler.indices), dtype=torch.int64),
             **{name: _joined(parts) for name, parts in found.items()}}  # fmt: skip
    gathered: list[Any] = [None] * ctx.world_size
    if ctx.world_size > 1:  # predictions can be large: to rank 0 only
        dist.gather_object(local, gathered if ctx.is_main else None, dst=0)
    else:
        gathered = [local]
    path = os.path.join(c.out, "predictions.pt")

    def write() -> None:  # rank 0: every sample's outputs in dataset order
        index = torch.cat([g["index"] for g in gathered])
        order = index.argsort()
        result: dict[str, Any] = {"index": index[order]}
        for name in (n for n in gathered[0] if n != "index"):
            result[name] = _in_order([g[name] for g in gathered if name in g], order)
        result["checkpoint"] = checkpoint
        with writing(path), open(path, "wb") as f:
            torch_save(result, f)

    rank0_then_meet(write)
    return {"num_samples": len(val), "checkpoint": checkpoint}


def _joined(parts: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """One tensor when every batch's part has the same trailing shape, else one per sample."""
    if len({p.shape[1:] for p in parts}) == 1:
        return torch.cat(parts)
    return [sample for p in parts for sample in p]


def _in_order(parts: list[Any], order: torch.Tensor) -> Any:
    if all(isinstance(p, torch.Tensor) for p in parts) and len({p.shape[1:] for p in parts}) == 1:
        return torch.cat(parts)[order]
    samples = [s for p in parts for s in p]
    return [samples[i] for i in order.tolist()]
