"""``python -m refddp.train``: resolve the config, check it, then run (or launch) the ranks.

User errors (a bad flag, a missing file, a checkpoint that does not fit) are caught here before
any rank starts, printed as one line, and exit with code 2.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from refddp.checkpoints import loading as ckpt
from refddp.checkpoints import run_state
from refddp.checkpoints.run_files import RunDirectoryInUse, RunFileError, hold_run_directory
from refddp.checkpoints.run_state import check_model_compatible
from refddp.config.command_line import load_yaml, merge, parse_cli
from refddp.config.schema import JOINED_WITH, ConfigError, TrainConfig
from refddp.config.validation import (
    list_items,
    per_rank_batch_size,
    refuse_checkpoint_imports,
    validate,
)
from refddp.launch import host_random
from refddp.launch.dist import (
    DistContext,
    RankZeroError,
    init_distributed,
    setup_logging,
    teardown,
    under_torchrun,
)
from refddp.launch.error_file import AGREED_STOP, LAUNCHED_ENV, USAGE, record_error
from refddp.launch.exits import end_process, lost_peer
from refddp.launch.slurm import srun_task
from refddp.launch.torchrun import CONFIG_ENV, launch
from refddp.training import trackers
from refddp.training.watchdog import HangWatchdog
from refddp.workload.data import build_datasets
from refddp.workload.models import build_model

log = logging.getLogger("refddp")
EXIT_USAGE = 2


Resumed = tuple[str, dict] | None  # (path, state) of the checkpoint `resume` names


def resolve_config(argv: list[str]) -> tuple[TrainConfig, Resumed, set[str]]:
    """CLI flag > --config YAML > the checkpoint's config (eval, predict, resume) > default.

    Also returns the checkpoint it read, so the checks that follow need not load it again, and
    the fields the command gave (flags and YAML).
    """
    cli, config_path = parse_cli(argv)
    from_yaml = load_yaml(config_path) if config_path else {}
    given = {*cli, *from_yaml}
    base = merge(cli, from_yaml)
    # resume, out and task never come from a checkpoint: base finds the same one c would.
    resumed = ckpt.load_resume_checkpoint(base)
    if resumed is None:
        return base, None, given
    c = merge(cli, from_yaml, resumed[1]["config"])
    if c.task == "train":  # the same run goes on: refused changes fail, its global batch stays
        c = run_state.continue_run(c, resumed[1], resumed[0], explicit=given)
    return c, resumed, given


def resolve_nproc(c: TrainConfig) -> int:
    if c.nproc:
        return c.nproc
    return torch.cuda.device_count() if c.device != "cpu" and torch.cuda.is_available() else 1


def preflight(c: TrainConfig, world_size: int, resumed: Resumed) -> None:
    """Every check that needs no rank: device, sizes, data, model, checkpoint, run directory."""
    uses_cuda = c.device == "cuda" or (c.device == "auto" and torch.cuda.is_available())
    if c.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but CUDA is not available here; use cpu or auto")
    if uses_cuda and world_size > torch.cuda.device_count():
        raise ConfigError(
            f"nproc: {world_size} ranks need {world_size} GPUs with NCCL, "
            f"found {torch.cuda.device_count()}"
        )
    if resumed is not None and c.task == "train":
        run_state.check_global_batch(c, world_size, resumed[1], resumed[0])
    if c.task == "train":
        for name in list_items(c.log_to):  # an optional package missing: one line, now
            trackers.tracker_class(name).check_installed()
    batch = per_rank_batch_size(c, world_size)
    if c.data == "synthetic":  # nothing to check but sizes; the ranks generate it
        n_train, n_val = c.train_size, c.val_size
    else:
        train, val = build_datasets(c)  # load it here: a bad file fails before any rank starts
        n_train, n_val = len(train), len(val)  # type: ignore[arg-type]
    global_batch = batch * world_size * c.grad_accum
    if resumed is not None and c.task == "train":  # before config.yaml records a refused end
        ends_at = run_state.total_steps(c, n_train // global_batch)  # (the sampler's count)
        run_state.refuse_an_end_behind(c, resumed[1]["step"], ends_at, resumed[0])
    if c.task == "train" and n_train < global_batch:
        raise ConfigError(
            f"data: {n_train} training samples for {world_size} rank(s) do not fill one global "
            f"batch of {global_batch}; lower batch_size or use more data"
        )
    if n_val == 0:  # training evaluates too: refuse now, not after an epoch
        raise ConfigError(f"data: the validation set of {c.data} is empty; it needs >= 1 sample")
    with torch.device("meta"):
        model = build_model(c)
    if resumed is not None:
        path, state = resumed
        check_model_compatible(model, state["model_state_dict"], path)
    elif c.init_from and c.task == "train":
        if not os.path.exists(c.init_from):
            raise ConfigError(f"init_from: checkpoint not found: {c.init_from}")
        check_model_compatible(
            model, ckpt.load_checkpoint(c.init_from)["model_state_dict"], c.init_from
        )
    try:
        os.makedirs(c.out, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=c.out):
            pass
    except OSError as exc:
        raise ConfigError(f"out: cannot write to run directory {c.out}: {exc.strerror}") from None


def take_rank0_run_config(c: TrainConfig, given: set[str], rank: int, world: int) -> TrainConfig:
    """Every training rank runs rank 0's run config; this invocation's own fields (out, resume,
    progress, ...) stay its own. ``given``: the fields this rank's command gave.

    Under plain torchrun each rank resolves its config itself, and what the command leaves out
    comes from the checkpoint it resumes. With a node-local ``--out`` only rank 0's node has it
    (every rank resumes from rank 0's state), so a rank elsewhere would build a fresh run's
    model or apply its learning rate: it takes rank 0's value for each field its command left
    out, and says which. A field given differently on two nodes, a ``device`` or ``timeout``
    (already used to join), or code to import that this rank's command does not name (unless
    it trusts checkpoint code) is refused on every rank in one line.
    """
    if world == 1:
        return c
    theirs = [c.run_fields if rank == 0 else None]
    dist.broadcast_object_list(theirs, src=0)
    conflicts, taken = [], {}
    for name, value in theirs[0].items():
        mine = getattr(c, name)
        if mine == value:
            continue
        # A field used to join the group (``joined=True``) must be given alike, as it was used
        # before the ranks could compare their configs.
        if name in given or name in JOINED_WITH:
            conflicts.append(f"{name}: rank 0 runs {value!r}, rank {rank} {mine!r}")
        else:
            taken[name] = value
    try:  # code to import that only rank 0 names: the rule a checkpoint's config meets
        refuse_checkpoint_imports(taken, {"trust_checkpoint_code": c.trust_checkpoint_code})
    except ConfigError as exc:
        conflicts.append(f"rank {rank}: {exc}")
    everyone: list[list[str]] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, conflicts)
    if any(everyone):
        raise ConfigError(
            f"config: the ranks' configs differ ({'; '.join(sum(everyone, []))}): give every "
            "node the same flags"
        )
    if taken:
        log.warning(
            "rank %d runs rank 0's config, which differs from the one resolved here in %s",
            rank,
            ", ".join(f"{k}={v!r} (here {getattr(c, k)!r})" for k, v in sorted(taken.items())),
        )
    c = dataclasses.replace(c, **taken)
    validate(c)
    return c


def run_rank(c: TrainConfig, given: set[str] | None = None) -> int:
    """One rank's whole life: join the group, run the task, leave. Returns the exit code.

    ``given``: the fields this rank's own command gave (plain torchrun: each rank resolves its
    config); None when every rank got the same config from refddp's launcher.
    """
    from refddp.training.evaluation import finite_validation, run_eval, run_predict
    from refddp.training.step_agreement import NonFiniteStep
    from refddp.training.trainer import Trainer

    stacks_dir = os.path.join(c.out, "stacks")
    # The hang watchdog (c.timeout) fires before the collective timeout does.
    ctx = init_distributed(c.device, c.timeout + 60, trace_dir=stacks_dir)
    setup_logging(ctx.rank, c.log_all_ranks)
    started, code = time.perf_counter(), 0
    unusable, recorded = "", False  # a run whose (final) evaluation is non-finite: exit 1
    stacks = os.path.join(stacks_dir, f"rank{ctx.rank}.txt")
    try:
        if c.task == "train" and given is not None:
            c = take_rank0_run_config(c, given, ctx.rank, ctx.world_size)
        if c.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(c.seed + ctx.rank)
        host_random.seed(c.seed + ctx.rank)  # Python's and numpy's: a dataset may draw from them
        with HangWatchdog(stacks, c.timeout) as watchdog:
            if c.task == "train":
                result = Trainer(c, ctx, watchdog).fit()
                summary = (
                    f"{'stopped' if result['stopped'] else 'done'}: step {result['step']}, "
                    + _validation_summary(result["metrics"])
                )
                if result["skipped_steps"]:
                    summary += f", {result['skipped_steps']} step(s) skipped as non-finite"
                # (what the done: line calls it, what the error line says, its metrics)
                judged = None if result["stopped"] else (
                    "the final evaluation", f"step {result['step']}: the final evaluation",
                    result["metrics"])
                if result["stopped_by"] and not under_torchrun():
                    # One process or an srun task, no launcher: its exit code tells preemption
                    # from completion, as the launcher's 128+N does for several ranks (srun
                    # exits with its tasks' highest code).
                    code = 128 + result["stopped_by"]
            elif c.task == "eval":
                r = run_eval(c, ctx)
                summary = (
                    f"eval: {_validation_summary(r)} over {r['num_samples']} samples -> "
                    f"{os.path.join(c.out, 'eval.json')}"
                )
                judged = ("the evaluation", f"the evaluation of {r['checkpoint']}", r)
            else:
                r = run_predict(c, ctx)
                summary = (
                    f"predict: {r['num_samples']} predictions -> "
                    f"{os.path.join(c.out, 'predictions.pt')}"
                )
                judged = None
            if judged is not None and not finite_validation(judged[2]):
                # The same metrics on every rank (agreed by the evaluation): all fail alike.
                short, what, metrics = judged
                unusable = f"{what} is non-finite ({_validation_summary(metrics)})"
                summary += f"; {short} is non-finite"
                code = 1
                # Said now: once a rank exits 1 the launcher may end this one mid-teardown.
                _log_summary(ctx, summary, started, c.out)
                summary = ""
                recorded = record_error(unusable, AGREED_STOP)
                if ctx.world_size > 1:  # none exits before every rank has recorded it
                    dist.barrier()
    except ConfigError as exc:
        # Possibly raised on this rank alone: the launcher prints it naming the rank.
        if not record_error(str(exc), USAGE):
            print(f"error: {'' if ctx.is_main else f'rank {ctx.rank}: '}{exc}", file=sys.stderr)
        return EXIT_USAGE
    except NonFiniteStep as exc:
        if not exc.recorded and (ctx.is_main or c.log_all_ranks):  # else the launcher says it
            print(f"error: {exc}", file=sys.stderr)
        return 1
    except (RankZeroError, RunFileError) as exc:
        if ctx.is_main or c.log_all_ranks:
            print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # a node lost mid-collective: named, on every rank left
        # (Under refddp's own launcher the ranks share one machine: the launcher names the
        # rank that died, and this rank's line would only repeat it as a victim's.)
        lost = None if os.environ.get(LAUNCHED_ENV) else lost_peer(exc)
        if lost is None:
            raise
        print(f"error: {lost}", file=sys.stderr)
        return 1
    finally:
        teardown()
    if summary:
        _log_summary(ctx, summary, started, c.out)
    if unusable and not recorded and ctx.is_main:
        print(f"error: {unusable}", file=sys.stderr)
    return code


def _log_summary(ctx: DistContext, summary: str, started: float, out: str) -> None:
    """Rank 0's last line: what the task did, how long it took, where its files are."""
    if ctx.is_main:
        elapsed = time.perf_counter() - started
        log.info("%s (%.1f s, %d rank(s), run directory %s)", summary, elapsed, ctx.world_size, out)


def _validation_summary(metrics: dict) -> str:
    """``val_loss 0.1662, val_acc 0.9341``: the validation metrics a record has (``not
    evaluated yet`` before the first evaluation: a nan there would read as a diverged run)."""
    found = {k: v for k, v in metrics.items() if k.startswith("val_") and isinstance(v, float)}
    if not found:
        return "not evaluated yet"
    return ", ".join(f"{k} {v:.4f}" for k, v in found.items())


_held: list = []  # the run directory's lock (``hold_for_training``): held until this process ends


def hold_for_training(c: TrainConfig) -> None:
    """A training run holds its ``out`` until its process exits: a second one started on it (in
    another process) is refused in one line (``hold_run_directory``). Not under srun, whose
    other tasks would wait for a refused rank 0 until their join timed out."""
    if c.task != "train":
        return
    try:
        _held.append(hold_run_directory(c.out))
    except RunDirectoryInUse as exc:
        raise ConfigError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if under_torchrun() and CONFIG_ENV in os.environ:  # a rank refddp's launcher started
            return run_rank(merge({}, json.loads(os.environ[CONFIG_ENV])))
        c, resumed, given = resolve_config(argv)
        if under_torchrun():
            if os.environ.get("RANK") == "0":  # (torchrun's agent then ends the other ranks)
                hold_for_training(c)
            return run_rank(c, given)
        task = srun_task()
        if task is not None:  # srun started every rank: each resolves its config, as above
            if c.nproc > 1:
                raise ConfigError(
                    f"nproc: under srun every task is one rank (this step has "
                    f"{task.world_size} tasks); drop --nproc, or run torchrun once per node "
                    "(examples/slurm/)"
                )
            return run_rank(c, given)
        world_size = resolve_nproc(c)
        preflight(c, world_size, resumed)
        hold_for_training(c)  # by the launcher, or the one process, until it exits
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if world_size == 1 and c.max_restarts == 0:
        return run_rank(c)
    env = {CONFIG_ENV: json.dumps(c.to_dict())}
    return launch("refddp.train", env, world_size, c.max_restarts, c.out, job="training")


if __name__ == "__main__":
    end_process(main)
