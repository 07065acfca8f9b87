"""Rank tasks that watch the trainer's step from inside: what a skipped step leaves behind, and
how many times a step reads from the device."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from refddp.launch.dist import init_distributed
from refddp.training.trainer import Trainer
from tests import recording_tracker
from tests.rank_tasks import tiny_config

# Every way a tensor's value reaches Python: each is a device-to-host read on a GPU.
HOST_READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")
# Reads of tensors that live on the host on a GPU too, or that are not the trainer's: torch's
# optimizers read their step counts (CPU tensors; a plain loop makes the same reads); the loader
# and its datasets (refddp's included) read the host batches they make; the trainer counts the
# step's targets on those host batches; the harness checks each collective's fingerprint.
# (file, function or "" for any)
NOT_THE_DEVICES = (("/torch/optim/", ""), ("/torch/utils/data/", ""), ("/refddp/workload/data.py", ""),
                   ("/refddp/training/steps.py", "host_target_count"),
                   ("/refddp/testing/checks/collectives.py", ""))  # fmt: skip


def local(value: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``value`` (an FSDP shard's local tensor), detached and copied."""
    return (value.to_local() if hasattr(value, "to_local") else value).detach().clone()


def trainer_state(trainer: Trainer) -> dict[str, Any]:
    """What a skipped step must leave as it was, on this rank: the model's parameters and
    buffers, the optimizer's state, the learning rates, the schedule, the update count and,
    under amp fp16, GradScaler's scale and growth count (which only an overflow's backoff may
    lower)."""
    optimizer = trainer.optimizer
    state = {f"model.{k}": local(v) for k, v in trainer.model.state_dict().items()}
    for index, param in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        for key, value in optimizer.state.get(param, {}).items():
            state[f"optimizer.{index}.{key}"] = local(value) if torch.is_tensor(value) else value
    state["lr"] = [g["lr"] for g in optimizer.param_groups]
    state["schedule"] = trainer.schedule.scheduler.last_epoch
    state["updates"] = trainer.pos.updates
    if trainer.scaling:
        state["scaler"] = trainer.scaler.state_dict()
    return state


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The keys whose values differ (NaN equal to NaN), or that one side lacks."""
    changed = sorted(before.keys() ^ after.keys())
    for key in before.keys() & after.keys():
        a, b = before[key], after[key]
        if torch.is_tensor(a):
            same = a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0,
                                                             equal_nan=True).all())  # fmt: skip
        else:
            same = a == b
        if not same:
            changed.append(key)
    return changed


def left_behind(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What a skipped step changed in ``trainer_state`` but GradScaler's backoff for an fp16
    overflow (a lower scale), which it must make."""
    found = differences(before, after)
    if "scaler" in found and after["scaler"]["scale"] < before["scaler"]["scale"]:
        found.remove("scaler")
    return found


def fit_checking_skipped_steps(out: str, **overrides) -> dict:
    """``fit``, comparing this rank's ``trainer_state`` before and after every step it skips:
    the steps checked and what each changed (nothing, if a skipped step leaves no trace)."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    train_step = trainer.train_step
    checked: list[int] = []
    changed: dict[int, list[str]] = {}

    def checking(batches: Any) -> int:
        before, skipped = trainer_state(trainer), trainer.pos.skipped_steps
        signum = train_step(batches)
        if trainer.pos.skipped_steps > skipped:
            checked.append(trainer.pos.step)
            found = left_behind(before, trainer_state(trainer))
            if found:
                changed[trainer.pos.step] = found
        return signum

    trainer.train_step = checking
    result = trainer.fit()
    return {"checked": checked, "changed": changed, "result": result,
            "weights": {k: local(v) for k, v in trainer.model.state_dict().items()}}  # fmt: skip


def read_by_the_trainer(frame: Any) -> bool:
    """Whether a read from ``frame`` reads the device: none of its callers is one of
    ``NOT_THE_DEVICES``."""
    while frame is not None:
        code = frame.f_code
        if any(place in code.co_filename and function in ("", code.co_name)
               for place, function in NOT_THE_DEVICES):  # fmt: skip
            return False
        frame = frame.f_back
    return True


@contextlib.contextmanager
def counting_host_reads() -> Iterator[list[int]]:
    """Count every read of a tensor's value into Python (``HOST_READS``) inside, but those
    made from ``NOT_THE_DEVICES``'s code."""
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(original: Any) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            count[0] += read_by_the_trainer(sys._getframe(1))
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield count
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def fit_counting_host_reads(out: str, **overrides) -> dict:
    """``fit``, counting the host reads of each step from the start of its ``train_step`` to the
    end of its ``end_of_step``: ``reads`` of the steps that neither evaluate nor checkpoint
    (which read more), and the steps ``skipped``."""
    if overrides.get("log_to") == "recording":
        recording_tracker.register()
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    train_step, end_of_step = trainer.train_step, trainer.end_of_step
    per_step: dict[int, int] = {}
    reads: list[int] = [0]
    plain: list[int] = []  # steps that neither evaluated nor saved
    skipped: list[int] = []

    def counted_step(batches: Any) -> int:
        before = trainer.pos.skipped_steps
        with counting_host_reads() as count:
            signum = train_step(batches)
        reads[0] = count[0]
        if trainer.pos.skipped_steps > before:
            skipped.append(trainer.pos.step)
        return signum

    def counted_end(signum: int, steps_this_run: int) -> bool:
        saves = trainer.save

        def save(*args: Any, **kwargs: Any) -> int:
            plain.remove(trainer.pos.step)
            return saves(*args, **kwargs)

        plain.append(trainer.pos.step)
        trainer.save = save  # every end of step that evaluates or checkpoints saves
        try:
            with counting_host_reads() as count:
                stopping = end_of_step(signum, steps_this_run)
        finally:
            del trainer.save
        per_step[trainer.pos.step] = reads[0] + count[0]
        return stopping

    trainer.train_step, trainer.end_of_step = counted_step, counted_end
    trainer.fit()
    return {"reads": {step: per_step[step] for step in plain}, "skipped": skipped}


def run_drawn_scenario(out: str, faults: dict, signalled: tuple | None, comm_hook: bool,
                       **overrides) -> dict:  # fmt: skip
    """One invocation of the trainer on this rank, with ``faults`` ({(rank, step, micro):
    "loss" or "gradient"}: that rank's loss of that step's micro-batch ``micro`` made inf with
    a finite gradient, or finite with a NaN gradient; micro-batches before the last run under
    ``no_sync``), ``signalled`` ((rank, step, signal name), sent to that rank after that step),
    and DDP's fp16 compression hook registered on the wrapped model when ``comm_hook``.

    Every skipped step is checked to leave this rank's ``trainer_state`` as it was; a run that
    stops on a non-finite step (``on_nonfinite=stop``) says at which step."""
    from refddp.testing import record_collectives
    from refddp.testing.checks.collectives import process_group_sequence
    from refddp.training.step_agreement import NonFiniteStep
    from tests.rank_tasks import after_the_step

    rank = torch.distributed.get_rank()
    c = tiny_config(out, **overrides)
    torch.manual_seed(c.seed + rank)  # as python -m refddp.train seeds (a warm rank carries any)
    with record_collectives() as log:
        trainer = Trainer(c, init_distributed("cpu"))
        if comm_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            trainer.parallel.wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
        micro_loss, train_step = trainer.micro_loss, trainer.train_step
        micro = [0]
        changed: dict[int, list[str]] = {}
        skipped: list[int] = []

        def faulty(module: Any, batch: Any) -> Any:
            loss = micro_loss(module, batch)
            if trainer.bucket_layout_pending:  # (DDP's settling backward, before step 1)
                return loss
            kind = faults.get((rank, trainer.pos.step + 1, micro[0]))
            micro[0] += 1
            if kind == "loss":  # inf, with a finite gradient (a constant added)
                return loss._replace(total=loss.total + float("inf"))
            if kind == "gradient":  # finite (0 added), with a NaN gradient (sqrt at 0)
                total = loss.total
                return loss._replace(total=total + ((total - total.detach()) ** 2).sqrt())
            return loss

        def step_checked(batches: Any) -> int:
            micro[0] = 0
            before, count = trainer_state(trainer), trainer.pos.skipped_steps
            signum = train_step(batches)
            if trainer.pos.skipped_steps > count:
                skipped.append(trainer.pos.step)
                found = left_behind(before, trainer_state(trainer))
                if found:
                    changed[trainer.pos.step] = found
            after_the_step(trainer, rank, signalled, met)
            return signum

        met: list[int] = []
        trainer.micro_loss, trainer.train_step = faulty, step_checked
        stopped_at = None
        try:
            result = trainer.fit()
        except NonFiniteStep:
            stopped_at = trainer.pos.step
            result = {"step": trainer.pos.step, "stopped_by": None,
                      "skipped_steps": trainer.pos.skipped_steps}  # fmt: skip
    return {
        "log": log,
        "sequence": process_group_sequence(),
        "step": result["step"],
        "stopped_by": result["stopped_by"],
        "skipped": result["skipped_steps"],
        "skipped_steps": skipped,
        "nonfinite_stop": stopped_at,
        "met": met,
        "changed": changed,
        "weights": trainer.parallel.model_state_dict(),  # (FSDP: the full state on rank 0)
        "optimizer": trainer.parallel.optimizer_state_dict(trainer.optimizer),
    }


def reduced_as_ddp_does() -> dict:
    """Which of a model's parameters DDP really all-reduced in one backward on rank-dependent
    inputs (equal gradients on every rank), beside which ``unreduced_parameters`` says it
    does not: a top-level parameter and a sub-module's are both listed to be ignored."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from refddp.training.parallel import unreduced_parameters

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 2)
            self.top = nn.Parameter(torch.zeros(2))
            self.expert = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.expert(self.linear(x) + self.top)

    torch.manual_seed(0)
    model = Model()
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["top", "expert.weight"])
    ddp = DDP(model)
    rank = torch.distributed.get_rank()
    ddp(torch.full((4, 3), float(rank + 1))).square().sum().backward()
    equal = {}
    for name, param in model.named_parameters():
        grads = [torch.empty_like(param.grad) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(grads, param.grad)
        equal[name] = all(torch.equal(g, grads[0]) for g in grads)
    unreduced = {id(p) for p in unreduced_parameters(ddp)}
    return {"reduced": sorted(n for n, same in equal.items() if same),
            "ours": sorted(n for n, p in model.named_parameters() if id(p) not in unreduced)}


def fit_recording_fetches(out: str, **overrides) -> dict:
    """``fit``, recording in order each batch fetched from the loader ("fetch"), each step's
    host read of its gradient's norm ("read") and each progress mark of the hang watchdog
    ("progress"), with the steps per epoch and the run's steps."""
    events: list[str] = []
    stepping = [False]  # the marks of evaluation batches and checkpoints are not the step's

    class RecordingWatchdog:
        def progress(self) -> None:
            if stepping[0]:
                events.append("progress")

    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"), RecordingWatchdog())
    epoch_batches, agreement_read = trainer.epoch_batches, trainer.agreement.read
    train_step = trainer.train_step

    def recording_step(batches: Any) -> int:
        stepping[0] = True
        try:
            return train_step(batches)
        finally:
            stepping[0] = False

    def recorded(iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            events.append("fetch")
            yield batch

    def recording_epoch_batches() -> Any:
        batches = epoch_batches()
        batches.iterator = recorded(batches.iterator)
        return batches

    def recording_read(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a step's read, with its norm (``settle`` reads with none)
            events.append("read")
        return agreement_read(*args, **kwargs)

    trainer.epoch_batches, trainer.agreement.read = recording_epoch_batches, recording_read
    trainer.train_step = recording_step
    result = trainer.fit()
    return {"events": events, "steps_per_epoch": trainer.sampler.steps_per_epoch,
            "steps": result["step"]}  # fmt: skip


def fit_recording_gradients(out: str, **overrides) -> dict:
    """``fit``, recording whether the trained parameters hold a gradient ("held": every one;
    "freed": none; "partly") after each step, at each step's start (after any evaluation or
    save of the step before, just before the step frees it) and at each step's first
    forward; which steps were skipped; and what they hold once ``fit`` has returned."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    after_step: dict[int, str] = {}
    at_start: dict[int, str] = {}
    first_forward_found: dict[int, str] = {}
    skipped: list[int] = []
    first = [False]

    def holding() -> str:
        held = sum(p.grad is not None for p in trained)
        return "held" if held == len(trained) else "freed" if held == 0 else "partly"

    def at_forward(*_: Any) -> None:
        if first[0] and torch.is_grad_enabled():
            first[0] = False
            first_forward_found[trainer.pos.step + 1] = holding()

    trainer.model.register_forward_pre_hook(at_forward)
    train_step, take = trainer.train_step, trainer.before_step.take

    def recording_take() -> None:  # the step's snapshot, just before it frees the gradient
        at_start[trainer.pos.step + 1] = holding()
        take()

    trainer.before_step.take = recording_take

    def recording_step(batches: Any) -> int:
        before, first[0] = trainer.pos.skipped_steps, True
        signum = train_step(batches)
        after_step[trainer.pos.step] = holding()
        if trainer.pos.skipped_steps > before:
            skipped.append(trainer.pos.step)
        return signum

    trainer.train_step = recording_step
    trainer.fit()
    return {"after_step": after_step, "at_start": at_start,
            "first_forward_found": first_forward_found, "skipped": skipped,
            "after_fit": holding()}  # fmt: skip


def fit_until_a_batch_fails(out: str, failing_item: int, **overrides) -> dict:
    """``fit`` over data whose ``failing_item``-th item served raises OSError: where the run
    was (its step and updates) when the error reached ``fit``'s caller, and the error."""
    trainer = Trainer(tiny_config(out, data="tests.user_code:failing_datasets", **overrides),
                      init_distributed("cpu"))  # fmt: skip
    dataset = trainer.train_set
    dataset.fail_at = dataset.served + failing_item  # (set-up may have fetched a first batch)
    try:
        trainer.fit()
    except OSError as error:
        return {"step": trainer.pos.step, "updates": trainer.pos.updates, "error": str(error),
                "batch_size": trainer.batch_size, "failing": dataset.fail_at}  # fmt: skip
    raise AssertionError("the failing item was never fetched")


def fit_from_seeded_host_rngs(out: str, signalled_after: int = 0, **overrides) -> dict:
    """``fit_full_weights`` (or, with ``signalled_after``, ``fit_signalled_after_step`` with
    SIGTERM to rank 1 after that step) from Python's and numpy's global RNGs seeded by rank:
    a spawned task does not pass through ``run_rank``, which seeds them, so runs compared draw
    from the same streams."""
    import random

    import numpy as np
    import torch.distributed as dist

    from tests.rank_tasks import fit_full_weights, fit_signalled_after_step

    random.seed(dist.get_rank())
    np.random.seed(dist.get_rank())
    if signalled_after:
        return fit_signalled_after_step(out, signalled_after, 1, **overrides)
    return fit_full_weights(out, **overrides)


def parallel_refusal(**overrides) -> str:
    """The one-line error building this rank's parallel raises for ``overrides`` ("": none).
    Run under the harness no rank is ended by another's failure, so each rank's answer shows."""
    from refddp.config.schema import ConfigError
    from refddp.training.parallel import build_parallel
    from refddp.workload.models import build_model

    c = tiny_config("unused", **overrides)
    try:
        build_parallel(build_model(c), c, init_distributed("cpu"))
    except ConfigError as exc:
        return str(exc)
    return ""
