"""Rank-side functions for the trackers, straggler and profiler tests (run through `spawn`)."""

from __future__ import annotations

import logging
import time

import torch.distributed as dist

from refddp.launch.dist import init_distributed
from refddp.training.trainer import Trainer
from tests import recording_tracker
from tests.rank_tasks import fit, tiny_config


def fit_with_recording_tracker(out: str, **overrides) -> dict:
    """``fit`` with ``--log-to recording``: what rank 0's tracker was sent (nothing on the
    other ranks)."""
    recording_tracker.register()
    found = fit(out, log_to="recording", **overrides)
    return {"step": found["step"], "points": list(recording_tracker.POINTS),
            "records": list(recording_tracker.RECORDS),
            "events": list(recording_tracker.EVENTS)}  # fmt: skip


def fit_with_a_slow_rank(
    out: str, slow_rank: int, delay_s: float, phase: str = "forward", **overrides
) -> dict:
    """``fit`` with ``slow_rank``'s every forward (``phase``), or backward, ``delay_s`` late
    (a slower device, say): the history records rank 0 sent its tracker, and the warnings it
    logged."""
    recording_tracker.register()
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("refddp").addHandler(handler)
    try:
        trainer = Trainer(tiny_config(out, log_to="recording", **overrides), init_distributed("cpu"))
        if dist.get_rank() == slow_rank and phase == "forward":
            trainer.model.register_forward_pre_hook(lambda module, args: time.sleep(delay_s))
        elif dist.get_rank() == slow_rank:  # as the backward reaches the model's output
            trainer.model.register_full_backward_pre_hook(lambda module, grad: time.sleep(delay_s))
        trainer.fit()
    finally:
        logging.getLogger("refddp").removeHandler(handler)
    return {"records": list(recording_tracker.RECORDS), "warnings": warnings}
