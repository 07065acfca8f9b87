"""Every option of ``python -m refddp.train``: its default, help text, choices, bounds and
policy on resume, declared on the field.

``TrainConfig`` is the single source: each field is a YAML key (``batch_size``) and a CLI flag
(``--batch-size``), and its ``help`` metadata is the flag's help. Reading them from the command
line and YAML: ``refddp/config/command_line.py``; checking them: ``refddp/config/validation.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from refddp.checkpoints import formats as checkpoint_formats
from refddp.training import trackers


class ConfigError(ValueError):
    """A user error in the configuration: printed as one line, exit code 2."""


# What a resumed run does with a run field's new value (applied by
# ``refddp/checkpoints/run_state.py``):
#   applied: in effect from the first resumed step; config.yaml records it.
#   refused: a usage error before any rank starts: it would be another run.
#   derived: the run's global batch is kept; the per-rank batch follows the new world size and
#            grad_accum (a batch_size/global_batch_size that would change it is refused).
APPLIED, REFUSED, DERIVED = "applied", "refused", "derived"
INVOCATION = None  # describes this invocation, not the run: never taken from a checkpoint


def _opt(
    default: Any,
    help: str,
    choices: tuple = (),
    *,
    resume: str | None,
    at_least: float | None = None,
    above: float | None = None,
    below: float | None = None,
    unit: str = "",
    imports: bool = False,
    joined: bool = False,
    items: tuple = (),
) -> Any:
    """One option and its whole policy, declared where the option is.

    ``resume``: APPLIED, REFUSED or DERIVED for a field of the run, INVOCATION for one of this
    invocation. ``at_least`` / ``above`` / ``below``: the bounds ``validate`` checks (``unit``
    names the bound's unit in the error). ``imports``: the value may name code to import
    (``package.module:callable``): never imported when only a checkpoint names it.
    ``joined``: used to join the process group, so every rank must be given the same value
    (``refddp.train.take_rank0_run_config``). ``items``: the value is a comma-separated list
    (in YAML, a list works too) of these choices.
    """
    assert resume in (APPLIED, REFUSED, DERIVED, INVOCATION), resume
    policy = {"help": help, "choices": choices, "resume": resume, "at_least": at_least,
              "above": above, "below": below, "unit": unit, "imports": imports,
              "joined": joined, "items": items}  # fmt: skip
    return field(default=default, metadata=policy)


@dataclass
class TrainConfig:
    task: str = _opt(
        "train", "what to do", ("train", "eval", "predict"), resume=INVOCATION
    )
    nproc: int = _opt(
        0,
        "local ranks to start when not under torchrun (0: one per visible GPU, else 1)",
        resume=INVOCATION,
        at_least=0,
    )
    max_restarts: int = _opt(
        0,
        "elastic restarts of failed ranks (torch.distributed.run)",
        resume=INVOCATION,
        at_least=0,
    )
    device: str = _opt(
        "auto", "where ranks run", ("auto", "cpu", "cuda"), resume=APPLIED, joined=True
    )
    model: str = _opt(
        "mlp",
        "built-in model (mlp, cnn, convnet) or package.module:callable",
        resume=REFUSED,
        imports=True,
    )
    dropout: float = _opt(
        0.1, "dropout probability of the convnet model", resume=REFUSED, at_least=0, below=1
    )
    sync_bn: bool = _opt(
        False, "batch norm statistics over the global batch (SyncBatchNorm)", resume=REFUSED
    )
    data: str = _opt(
        "synthetic",
        "'synthetic' (generated from the seed), a .pt file holding "
        "x and y (or train_x, train_y, val_x, val_y), a directory of images (train/ and val/, "
        "one subfolder per class; needs torchvision), or package.module:callable",
        resume=REFUSED,
        imports=True,
    )
    loss: str = _opt(
        "cross_entropy",
        "what is minimised: cross_entropy (classes per sample or per token, labels -100 "
        "ignored), model (the model returns its loss, as HF models do given labels) or "
        "package.module:callable, called as fn(outputs, batch) and returning (loss_sum, count) "
        "or a batch mean; normalised by the global batch's target count where it can be",
        resume=REFUSED,
        imports=True,
    )
    metrics: str = _opt(
        "",
        "package.module:callable called as fn(outputs, batch) on each validation batch, "
        "returning a dict of sums (or (sum, count) pairs) reported as val_NAME (empty: none)",
        resume=APPLIED,
        imports=True,
    )
    train_size: int = _opt(
        16384, "samples in the synthetic training set", resume=REFUSED, at_least=1
    )
    val_size: int = _opt(
        2048, "samples in the synthetic validation set", resume=REFUSED, at_least=1
    )
    input_dim: int = _opt(32, "features per synthetic sample", resume=REFUSED, at_least=1)
    augment: float = _opt(
        0.0,
        "std of Gaussian noise added to each training sample when fetched (0: off)",
        resume=REFUSED,
        at_least=0,
    )
    num_classes: int = _opt(
        4, "classes of the data (an image folder: its class folders)", resume=REFUSED, at_least=2
    )
    image_size: int = _opt(
        224,
        "side of the square images an image folder yields (random-resized crops in training, "
        "centre crops in validation)",
        resume=REFUSED,
        at_least=8,
    )
    hidden_size: int = _opt(128, "width of the built-in models", resume=REFUSED, at_least=1)
    depth: int = _opt(2, "hidden layers of the built-in models", resume=REFUSED, at_least=0)
    epochs: int = _opt(5, "passes over the training data", resume=APPLIED, at_least=0)
    max_steps: int = _opt(
        0,
        "stop after this many training steps in total (skipped ones included) (0: no limit)",
        resume=APPLIED,
        at_least=0,
    )
    batch_size: int = _opt(128, "per-rank micro-batch size", resume=DERIVED, at_least=1)
    global_batch_size: int = _opt(
        0,
        "samples per optimizer step over all ranks; sets "
        "batch_size = global / (world size x grad_accum) (0: unused)",
        resume=DERIVED,
        at_least=0,
    )
    grad_accum: int = _opt(
        1,
        "micro-batches per optimizer step (DDP no_sync on all but the last)",
        resume=APPLIED,
        at_least=1,
    )
    lr: float = _opt(3e-3, "peak learning rate", resume=APPLIED, above=0)
    optimizer: str = _opt("adamw", "optimizer", ("adamw", "sgd"), resume=REFUSED)
    momentum: float = _opt(0.9, "SGD momentum", resume=APPLIED, at_least=0)
    weight_decay: float = _opt(
        0.0, "decoupled (AdamW) or L2 (SGD) weight decay", resume=APPLIED, at_least=0
    )
    lr_schedule: str = _opt(
        "cosine",
        "learning-rate schedule after warm-up",
        ("cosine", "constant"),
        resume=APPLIED,
    )
    warmup_steps: int = _opt(
        0,
        "linear warm-up, in applied updates (a skipped step does not count)",
        resume=APPLIED,
        at_least=0,
    )
    grad_clip: float = _opt(
        0.0, "clip the gradient norm to this (0: off)", resume=APPLIED, at_least=0
    )
    amp: str = _opt("off", "mixed precision", ("off", "fp16", "bf16"), resume=REFUSED)
    dtype: str = _opt(
        "float32",
        "parameter and data dtype (float64 for exact tests)",
        ("float32", "float64"),
        resume=REFUSED,
    )
    num_workers: int = _opt(
        0, "DataLoader worker processes per rank", resume=APPLIED, at_least=0
    )
    worker_start: str = _opt(
        "auto",
        "how loader workers start: fork, forkserver (each a fork of a clean process: the "
        "dataset must pickle) or spawn; auto: forkserver on Pythons where a forked worker of "
        "a rank can deadlock (3.10 before 3.10.15, 3.11 before 3.11.10: CPython gh-112275; "
        "fork, warned, if the workers cannot start from it), else the platform's default "
        "(fork on Linux before Python 3.14)",
        ("auto", "fork", "forkserver", "spawn"),
        resume=APPLIED,
    )
    seed: int = _opt(
        0, "seed for data generation, initialisation, shuffling, dropout and each rank's "
        "torch, Python and numpy random streams", resume=REFUSED
    )
    deterministic: bool = _opt(False, "use deterministic algorithms only", resume=APPLIED)
    strategy: str = _opt(
        "ddp",
        "how the model is spread over ranks: ddp (replicated) or fsdp (FSDP2 fully_shard: "
        "parameters, gradients and optimizer state sharded)",
        ("ddp", "fsdp"),
        resume=APPLIED,
    )
    ckpt_format: str = _opt(
        "full",
        "checkpoint format: full (checkpoint_latest.pth, one plain file gathered to rank 0 "
        "that torch.load opens anywhere) or dcp (checkpoint_latest.dcp, a "
        "torch.distributed.checkpoint directory each rank writes its own shards into, no "
        "gather; needs an --out every rank sees; python -m refddp.convert_checkpoint makes a "
        "full file of it)",
        checkpoint_formats.NAMES,
        resume=APPLIED,
    )
    find_unused_parameters: bool = _opt(
        False, "DDP find_unused_parameters (costs a graph walk)", resume=APPLIED
    )
    compile: bool = _opt(False, "torch.compile the model", resume=APPLIED)
    out: str = _opt("runs/default", "run directory", resume=INVOCATION)
    resume: str = _opt(
        "auto",
        "'auto' (latest in out, if any), 'never', or a checkpoint path",
        resume=INVOCATION,
    )
    init_from: str = _opt(
        "",
        "start a new run from this checkpoint's weights only (fresh optimizer, schedule and "
        "position; its config is not read); ignored once out holds a checkpoint to resume",
        resume=INVOCATION,
    )
    ckpt_every: int = _opt(
        0,
        "training steps between checkpoints (0: end of each epoch only)",
        resume=APPLIED,
        at_least=0,
    )
    eval_every: int = _opt(
        0,
        "training steps between evaluations (0: end of each epoch only)",
        resume=APPLIED,
        at_least=0,
    )
    stop_after: int = _opt(
        0,
        "stop this invocation (checkpoint and exit) after this many "
        "training steps; the schedule is unaffected (0: off)",
        resume=INVOCATION,
        at_least=0,
    )
    on_nonfinite: str = _opt(
        "skip",
        "what every rank does with a step whose loss (on any rank) or all-reduced gradient is "
        "inf/nan: skip its update (the model, its buffers, the optimizer and the schedule "
        "stay as they were), or stop; under amp fp16 a gradient overflow behind finite losses "
        "is skipped in both modes while the loss scale can still fall (min_loss_scale)",
        ("skip", "stop"),
        resume=APPLIED,
    )
    max_consecutive_skips: int = _opt(
        20,
        "stop the run (exit 1) when this many steps in a row were skipped as non-finite: it "
        "trains nothing (0: no limit; a run whose every step was skipped fails at its end "
        "whatever this is)",
        resume=APPLIED,
        at_least=0,
    )
    min_loss_scale: float = _opt(
        1.0,
        "amp fp16: stop the run (exit 1) when a gradient overflow would take GradScaler's loss "
        "scale below this (its gradients are non-finite at every scale that helps); below "
        "65536, the scale GradScaler starts at",
        resume=APPLIED,
        above=0,
        below=65536,
    )
    progress: bool = _opt(True, "rank-0 progress bar", resume=INVOCATION)
    log_all_ranks: bool = _opt(
        False, "every rank logs, prefixed with [rank N]", resume=INVOCATION
    )
    log_to: str = _opt(
        "jsonl",
        "where rank 0 sends the metrics, comma-separated (in YAML, a list works too): jsonl "
        "(history.jsonl, always on), tensorboard (event files in OUT/tensorboard/; the "
        "tensorboard extra), wandb (OUT/wandb/, offline unless WANDB_MODE or a W&B login says "
        "otherwise; the wandb extra)",
        items=trackers.NAMES,
        resume=APPLIED,
    )
    log_every: int = _opt(
        10,
        "steps between training-loss and learning-rate points sent to tensorboard/wandb (the "
        "loss rides the next step's small all-reduce, read with the step's norm); 0: "
        "evaluations only",
        resume=APPLIED,
        at_least=0,
    )
    stop_check_s: float = _opt(
        0.1,
        "seconds of training between the ranks' checks for a stop signal (SIGTERM, SIGINT, "
        "SIGUSR1) on steps that do not meet anyway (a per-sample loss, no loss to log): every "
        "rank stops together at the first check, evaluation or checkpoint after any rank "
        "received one; 0: every step (one small all-reduce a step)",
        resume=APPLIED,
        at_least=0,
        unit=" seconds",
    )
    profile: str = _opt(
        "",
        "START:END: a torch.profiler trace of training steps START to END (inclusive) per "
        "rank in OUT/profile/rankN.json (Chrome/Perfetto), with shapes and memory; on CUDA "
        "also a memory snapshot (rankN_memory.pickle); empty: off",
        resume=INVOCATION,
    )
    timeout: float = _opt(
        300.0,
        "seconds without progress before a rank is declared hung, at most a week "
        "(stacks are written to out/stacks/)",
        resume=APPLIED,
        above=0,
        unit=" seconds",
        joined=True,
    )
    trust_checkpoint_code: bool = _opt(
        False,
        "import the model/data code (package.module:callable) a loaded checkpoint names; "
        "only for checkpoints you trust",
        resume=INVOCATION,
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_fields(self) -> dict[str, Any]:
        """The fields that describe the run (what a checkpoint's config passes on)."""
        return {name: getattr(self, name) for name in RUN_FIELDS}


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
# The tables other modules use, derived from the fields' own policies.
RUN_FIELDS = tuple(name for name, f in FIELDS.items() if f.metadata["resume"] is not INVOCATION)
ON_RESUME = {name: FIELDS[name].metadata["resume"] for name in RUN_FIELDS}
IMPORT_FIELDS = tuple(name for name, f in FIELDS.items() if f.metadata["imports"])
JOINED_WITH = tuple(name for name, f in FIELDS.items() if f.metadata["joined"])
