"""Evaluation and prediction: every sample exactly once, at any world size.

Each rank runs the model over its unpadded shard; sums and counts then meet in one all-reduce
(eval) or one gather (predict). Under DDP the plain model runs (no collectives while shards
differ in length); under FSDP every forward gathers parameters, so ranks run the same number
of forwards, the ones past their shard's end counting nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from refddp import checkpoint as ckpt
from refddp.config import TrainConfig
from refddp.data import ShardSampler, build_datasets, make_loader
from refddp.dist import DistContext, agree_any, rank0_then_meet
from refddp.models import build_model
from refddp.parallel import runs_in_lockstep
from refddp.watchdog import HangWatchdog


def autocast(c: TrainConfig, device: torch.device) -> Any:
    if c.amp == "off":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if c.amp == "fp16" else torch.bfloat16)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Any,
    c: TrainConfig,
    ctx: DistContext,
    watchdog: HangWatchdog | None,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Loss and accuracy over every validation sample exactly once, at any world size.

    ``stop()`` true on any rank ends the evaluation early on that rank; the all-reduce every
    rank meets at tells them all, and the result says ``interrupted`` instead of metrics.
    """
    device = torch.device(ctx.device)
    model = ckpt.unwrap(model)  # plain forward: no DDP collectives while shards differ in length
    lockstep = runs_in_lockstep(model)  # FSDP: each forward gathers parameters from every rank
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, correct, count, stop
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
            sums[3] = 1
            break
        counted = batch is not None
        batch = batch if counted else filler or _first_item_batch(dataset)
        filler = batch
        x, y = (t.to(device, non_blocking=True) for t in batch)
        with autocast(c, device):
            logits = model(x)
        if not counted:
            continue
        # Half-precision (AMP) logits are upcast for the loss; float64 ones stay float64.
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
        sums[1] += (logits.argmax(dim=1) == y).sum()
        sums[2] += len(y)
        if watchdog:
            watchdog.progress()
    dist.all_reduce(sums)  # sums and counts, not means: exact with uneven shards
    model.train(was_training)
    loss, correct, count, stopped = sums.tolist()
    if stopped:
        return {"interrupted": True}
    return {
        "val_loss": loss / count,
        "val_acc": correct / count,
        "num_samples": int(count),
        "interrupted": False,
    }


def _first_item_batch(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-sample batch for a rank whose shard is empty (lockstep forwards only)."""
    x, y = dataset[0]
    return torch.as_tensor(x).unsqueeze(0), torch.as_tensor(y).unsqueeze(0)


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
        with ckpt.writing(path), open(path, "w") as f:
            json.dump(result, f, indent=2)

    rank0_then_meet(write)
    return result


@torch.no_grad()
def run_predict(c: TrainConfig, ctx: DistContext) -> dict[str, Any]:
    """Predict the validation set; rank 0 writes every sample's prediction, in dataset order."""
    model, path = load_for_inference(c, ctx)
    model.eval()
    _, val = build_datasets(c)
    sampler = ShardSampler(len(val), ctx.world_size, ctx.rank)
    loader = make_loader(val, sampler, c.batch_size, c, False, c.seed)
    logits = [model(x.to(ctx.device)).float().cpu() for x, _ in loader]
    local = (
        torch.tensor(list(sampler.indices), dtype=torch.int64),
        torch.cat(logits) if logits else torch.empty(0, c.num_classes),
    )
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, local)
    index = torch.cat([g[0] for g in gathered])
    order = index.argsort()
    all_logits = torch.cat([g[1] for g in gathered])[order]
    result = {
        "index": index[order],
        "logits": all_logits,
        "prediction": all_logits.argmax(1),
        "checkpoint": path,
    }
    path = os.path.join(c.out, "predictions.pt")

    def write() -> None:
        with ckpt.writing(path), open(path, "wb") as f:
            ckpt.torch_save(result, f)

    rank0_then_meet(write)
    return {"num_samples": len(index), "checkpoint": path}
