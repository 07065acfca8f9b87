"""Functions the proof suite runs on every rank (through `spawn`), and the configs they use."""

from __future__ import annotations

import difflib
import os
import random
import signal
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from refddp.checkpoints.run_state import unwrap
from refddp.config.schema import TrainConfig
from refddp.launch.dist import init_distributed
from refddp.testing import record_collectives
from refddp.testing.checks.collectives import process_group_sequence
from refddp.training.evaluation import evaluate
from refddp.training.trainer import Trainer

# Small, float64, deterministic: tight tolerances mean something.
TINY = dict(
    train_size=96,
    val_size=37,
    input_dim=8,
    hidden_size=16,
    batch_size=4,
    epochs=2,
    dtype="float64",
    deterministic=True,
    progress=False,
    lr=1e-2,
)


def tiny_config(out: str, **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, "out": out, **overrides})


def state_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in unwrap(module).state_dict().items()}


def fit(out: str, **overrides) -> dict:
    """Run the real trainer in this rank; its final weights and where it stopped."""
    c = tiny_config(out, **overrides)
    trainer = Trainer(c, init_distributed("cpu"))
    result = trainer.fit()
    return {
        "weights": state_of(trainer.model),
        "step": result["step"],
        "result": result,
        "scale": trainer.scaler.get_scale() if trainer.scaler.is_enabled() else None,
    }


def fit_seeded(out: str, **overrides) -> dict:
    """``fit`` with each rank's random stream seeded as ``python -m refddp.train`` seeds it
    (a warm pool's ranks carry whatever state earlier tests left: dropout would differ)."""
    c = tiny_config(out, **overrides)
    torch.manual_seed(c.seed + dist.get_rank())
    return fit(out, **overrides)


def host_draws_after_resume(out: str, **overrides) -> tuple[float, float, float]:
    """This rank's first draws from Python's, numpy's and torch's global RNGs once the
    trainer has resumed from ``out`` (built, not fitted)."""
    Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def fit_recording_collectives(out: str, **overrides) -> dict:
    c = tiny_config(out, **overrides)
    with record_collectives() as log:
        trainer = Trainer(c, init_distributed("cpu"))
        trainer.fit()
    group = dist.distributed_c10d._get_default_group()
    return {"log": log, "sequence": group._get_sequence_number_for_group()}


def eval_model(weights: dict, **overrides) -> dict:
    c = tiny_config("unused", **overrides)
    from refddp.workload.data import build_datasets
    from refddp.workload.models import build_model

    model = build_model(c)
    model.load_state_dict(weights)
    return evaluate(model, build_datasets(c)[1], c, init_distributed("cpu"), None)


def describe_objective(out: str, **overrides) -> str:
    """What a trainer built for this config says, at start-up, about its loss."""
    return Trainer(tiny_config(out, **overrides), init_distributed("cpu")).objective.describe()


def evaluate_fresh_model(**overrides) -> dict:
    """The freshly initialised model of this config, evaluated on every rank."""
    from refddp.workload.data import build_datasets
    from refddp.workload.models import build_model

    c = tiny_config("unused", **overrides)
    return evaluate(build_model(c), build_datasets(c)[1], c, init_distributed("cpu"), None)


def scale_after_resume(out: str, **overrides) -> float:
    """The GradScaler scale a trainer starts with after resuming from ``out``."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    return trainer.scaler.get_scale()


def doctor_check(skip_rank: int | None = None, barrier_s: float = 2.0, **overrides) -> dict | None:
    """Run the doctor's checks on this rank; ``skip_rank`` plants a rank that never arrives."""
    from refddp.doctor import check

    if skip_rank is not None and dist.get_rank() == skip_rank:
        return None
    return check(tiny_config("unused", **overrides), barrier_timeout_s=barrier_s, repeats=2)


def nccl_gradients() -> torch.Tensor:
    """Flattened DDP gradients after one backward on this rank's GPU (different data per rank)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    ddp = DDP(model.to(device), device_ids=[device.index], bucket_cap_mb=0.01)
    torch.manual_seed(1 + dist.get_rank())
    ddp(torch.randn(16, 64, device=device)).sum().backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).cpu()


def nccl_rank_sum() -> float:
    t = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
    dist.all_reduce(t)
    return t.item()


def first_update_norm(out: str, **overrides) -> float:
    """Norm of the parameter change made by one optimizer step of the real trainer."""
    c = tiny_config(out, **overrides)
    trainer = Trainer(c, init_distributed("cpu"))
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.fit()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return float((after - before).norm())


def count_step_collectives(out: str, **overrides) -> dict:
    """Train, counting the default group's collectives during each optimizer step.

    DDP's bucket all-reduce is issued in C++ (``record_collectives`` cannot see it); the
    group's sequence number counts it (``process_group_sequence``).
    """
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    counts: list[int] = []
    step = trainer.train_step

    def counted(batches):  # type: ignore[no-untyped-def]
        before = process_group_sequence()
        signum = step(batches)
        counts.append(process_group_sequence() - before)
        return signum

    trainer.train_step = counted  # type: ignore[method-assign]
    result = trainer.fit()
    return {"collectives": counts, "steps": result["step"]}


def autocast_dtypes_seen(out: str, **overrides) -> set:
    """The dtypes the trainer's forward produced (a hook on the model's output layer)."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    seen: set = set()
    last_layer = [m for m in trainer.model.modules() if isinstance(m, nn.Linear)][-1]
    last_layer.register_forward_hook(lambda module, args, output: seen.add(output.dtype))
    trainer.fit()
    return seen


def fit_signalled_during_save(out: str, save_step: int, **overrides) -> dict:
    """``fit``, with rank 0 sent SIGTERM while it writes the checkpoint of ``save_step``."""
    import os
    import signal

    from refddp.checkpoints import full as checkpoint

    write = checkpoint.write_checkpoint

    def write_while_signalled(state, out_dir, is_best):
        if state["step"] == save_step:
            os.kill(os.getpid(), signal.SIGTERM)  # lands in the middle of the save
        return write(state, out_dir, is_best)

    checkpoint.write_checkpoint = write_while_signalled
    try:
        return fit(out, **overrides)["result"]
    finally:
        checkpoint.write_checkpoint = write


def fit_then_save_full(out: str, **overrides) -> int:
    """``fit`` with ``ckpt_format=dcp``, then save the same state again in the full format:
    two checkpoints of one run at one step (the RNG states too: saving draws no random
    number). Returns the step."""
    import dataclasses

    c = tiny_config(out, ckpt_format="dcp", **overrides)
    trainer = Trainer(c, init_distributed("cpu"))
    result = trainer.fit()
    trainer.c = dataclasses.replace(c, ckpt_format="full")
    trainer.save()
    return result["step"]


def fit_full_weights(out: str, **overrides) -> dict:
    """``fit``, returning the full (gathered) model and optimizer state on rank 0 whatever
    the strategy (FSDP ranks hold shards)."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    result = trainer.fit()
    return {
        "weights": trainer.parallel.model_state_dict(),
        "optimizer": trainer.parallel.optimizer_state_dict(trainer.optimizer),
        "step": result["step"],
        "result": result,
        "stopped_by": result["stopped_by"],
        "resumed_from": trainer.resumed_from,
        "fused": all(g.get("fused") for g in trainer.optimizer.param_groups),
    }


def optimizer_where_cuda_fuses(out: str, fuses: bool, **overrides) -> dict:
    """A trainer built on the CPU with ``fuses_on_cuda`` answering ``fuses`` (as it would on a
    GPU): whether its optimizer runs fused kernels."""
    import refddp.training.run_setup

    real = refddp.training.run_setup.fuses_on_cuda
    refddp.training.run_setup.fuses_on_cuda = lambda c, device: fuses
    try:
        trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    finally:
        refddp.training.run_setup.fuses_on_cuda = real
    return {"fused": [bool(g.get("fused")) for g in trainer.optimizer.param_groups]}


def fit_recording_scales(out: str, **overrides) -> dict:
    """``fit`` under ``amp fp16``, recording after each step (step, skipped steps so far,
    GradScaler's scale)."""
    trainer = Trainer(tiny_config(out, amp="fp16", dtype="float32", **overrides),
                      init_distributed("cpu"))  # fmt: skip
    train_step, steps = trainer.train_step, []

    def recorded(batches):
        signum = train_step(batches)
        steps.append((trainer.pos.step, trainer.pos.skipped_steps, trainer.scaler.get_scale()))
        return signum

    trainer.train_step = recorded
    trainer.fit()
    return {"steps": steps, "initial": trainer.scaler.get_scale() if not steps else None}


def fit_full_weights_where_cuda_fuses(out: str, fuses: bool, **overrides) -> dict:
    """``fit_full_weights`` with ``fuses_on_cuda`` answering ``fuses``: the optimizer built
    fused, as on a GPU."""
    import refddp.training.run_setup

    real = refddp.training.run_setup.fuses_on_cuda
    refddp.training.run_setup.fuses_on_cuda = lambda c, device: fuses
    try:
        return fit_full_weights(out, **overrides)
    finally:
        refddp.training.run_setup.fuses_on_cuda = real


def fit_signalled_after_step(out: str, step: int, signalled_rank: int, **overrides) -> dict:
    """``fit_full_weights``, with SIGTERM sent to ``signalled_rank`` alone right after its
    step ``step`` (the other ranks learn of it at the next stop check, every step with
    ``stop_check_s=0``)."""
    import os
    import signal

    train_step = Trainer.train_step

    def signalled(self, batches):
        signum = train_step(self, batches)
        if self.pos.step == step and dist.get_rank() == signalled_rank:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler only sets a flag
        return signum

    Trainer.train_step = signalled
    try:
        return fit_full_weights(out, **overrides)
    finally:
        Trainer.train_step = train_step


def fit_with_a_failing_dcp_save(out: str, failing_save: int, **overrides) -> str:
    """``fit`` with ``ckpt_format=dcp``, its ``failing_save``-th save failing on rank 0 after
    every rank wrote its shards (as a full disk would, while writing DCP's .metadata).
    Returns the error the trainer raised."""
    from torch.distributed.checkpoint import FileSystemWriter

    from refddp.checkpoints.run_files import RunFileError

    finish, saves = FileSystemWriter.finish, []

    def failing_finish(self, metadata, results):  # DCP calls it on rank 0 only
        saves.append(self.path)
        if len(saves) == failing_save:
            raise OSError(28, "No space left on device")
        return finish(self, metadata, results)

    FileSystemWriter.finish = failing_finish
    try:
        fit(out, ckpt_format="dcp", **overrides)
    except RunFileError as exc:
        return str(exc)
    finally:
        FileSystemWriter.finish = finish
    return "no error"


def fit_counting_compiled_graphs(out: str, **overrides) -> dict:
    """``fit_full_weights``, with the number of graphs torch.compile compiled meanwhile."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    result = fit_full_weights(out, **overrides)
    return {**result, "graphs": counters["stats"]["unique_graphs"] - before}


def fit_on_gpu_counting_host_syncs(out: str, **overrides) -> dict:
    """``fit`` on this rank's GPU with CUDA's sync debug mode set to "warn" inside every
    optimizer step but the first two (the optimizer's state and DDP's buckets are made there):
    the host syncs each of those steps made, and whether the optimizer was fused."""
    c = tiny_config(out, device="cuda", dtype="float32", **overrides)
    trainer = Trainer(c, init_distributed("cuda"))
    train_step, syncs = trainer.train_step, []
    with warnings.catch_warnings():  # the mode's own first switch syncs: made before counting
        warnings.simplefilter("ignore")
        torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.set_sync_debug_mode("default")

    def counted(batches):
        if trainer.pos.step < 2:
            return train_step(batches)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return train_step(batches)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                syncs.append(sum("synchroniz" in str(w.message) for w in caught))

    trainer.train_step = counted
    result = trainer.fit()
    return {
        "syncs": syncs,
        "step": result["step"],
        "fused": all(g.get("fused") for g in trainer.optimizer.param_groups),
    }


def config_after_taking_rank0s(fields: list[dict], given: list[list[str]]) -> dict | str:
    """``take_rank0_run_config`` on this rank's ``fields[rank]`` (its command gave
    ``given[rank]``): the run fields it ends with, or its one-line refusal."""
    from refddp.config.schema import ConfigError
    from refddp.train import take_rank0_run_config

    rank = dist.get_rank()
    c = TrainConfig(**fields[rank])
    try:
        return take_rank0_run_config(c, set(given[rank]), rank, dist.get_world_size()).run_fields
    except ConfigError as exc:
        return str(exc)


# Padded sequences of 2-10 tokens (tests/sequence_code.py): targets per sample vary.
TOKENS = dict(model="tests.sequence_code:tiny_lm", data="tests.sequence_code:shifted_sequences",
              num_classes=12, input_dim=10)  # fmt: skip
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1}


def run_scenario(out: str, faults: dict, signalled: tuple | None, **overrides) -> dict:
    """One invocation of the trainer on this rank, with ``faults`` ({(rank, step): "loss" or
    "gradient"}: that rank's loss of that step made inf, or its gradient NaN behind a finite
    loss) and ``signalled`` ((rank, step, signal name): sent to that rank after that step)."""
    c = tiny_config(out, **overrides)
    rank = dist.get_rank()
    with record_collectives() as log:
        trainer = Trainer(c, init_distributed("cpu"))
        micro_loss, train_step = trainer.micro_loss, trainer.train_step

        def faulty(module, batch):
            loss = micro_loss(module, batch)
            kind = faults.get((rank, trainer.pos.step + 1))
            if kind == "loss":  # inf, with a finite gradient (a constant added)
                return loss._replace(total=loss.total + float("inf"))
            if kind == "gradient":  # finite (0 added), with a NaN gradient (sqrt at 0)
                total = loss.total
                return loss._replace(total=total + ((total - total.detach()) ** 2).sqrt())
            return loss

        def step_then_signal(batches):
            signum = train_step(batches)
            after_the_step(trainer, rank, signalled, met)
            return signum

        met: list[int] = []
        trainer.micro_loss, trainer.train_step = faulty, step_then_signal
        result = trainer.fit()
    return {
        "log": log,
        "sequence": process_group_sequence(),
        "step": result["step"],
        "stopped_by": result["stopped_by"],
        "skipped": result["skipped_steps"],
        "met": met,
        "weights": trainer.parallel.model_state_dict(),  # (FSDP: the full state on rank 0)
    }


def after_the_step(trainer: Trainer, rank: int, signalled: tuple | None, met: list[int]) -> None:
    """What a scenario does after each step: note in ``met`` whether the step could have
    stopped (its agreement met; one process reads its own signal every step), then send
    ``signalled``'s signal ((rank, step, signal name)) to this rank if it is that rank's step."""
    if not trainer.several or trainer.agreement.step_met:
        met.append(trainer.pos.step)
    if signalled and (rank, trainer.pos.step) == tuple(signalled[:2]):
        os.kill(os.getpid(), SIGNALS[signalled[2]])  # the handler only sets a flag


def assert_in_step(ranks: list[dict]) -> None:
    """Every rank issued the same collectives, as many, and ended at the same step."""
    first = ranks[0]
    for rank, found in enumerate(ranks[1:], start=1):
        assert found["log"] == first["log"], (
            f"rank {rank}'s collectives differ from rank 0's:\n"
            + "\n".join(difflib.unified_diff(first["log"], found["log"], "rank 0", f"rank {rank}",
                                              lineterm="", n=1))  # fmt: skip
        )
        assert found["sequence"] == first["sequence"], "DDP's own all-reduces differ"
        assert found["met"] == first["met"], "the ranks met on different steps"
        assert (found["step"], found["stopped_by"], found["skipped"]) == (
            first["step"], first["stopped_by"], first["skipped"]
        )  # fmt: skip


def fit_recording(out: str, record: str, **overrides) -> int:
    """``fit`` on data that writes every index it serves to ``record/rank<R>.txt``."""
    os.environ["REFDDP_TEST_RECORD"] = record
    try:
        return fit(out, data="tests.user_code:recording_datasets", **overrides)["step"]
    finally:
        del os.environ["REFDDP_TEST_RECORD"]


def raises_after_one_all_reduce(bad_rank: int) -> None:
    """Every rank all-reduces once; then ``bad_rank`` raises while the others wait in the next."""
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == bad_rank:
        raise ValueError(f"rank {bad_rank}'s own bug")
    dist.all_reduce(torch.ones(1))
