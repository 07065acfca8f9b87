"""Every option of ``python -m refddp.train``: its default, help text and validation.

``TrainConfig`` is the single source: each field is a YAML key (``batch_size``) and a CLI flag
(``--batch-size``), and its ``help`` metadata is the flag's help. Precedence when resolving:
CLI flag > ``--config FILE.yaml`` > the loaded checkpoint's config > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

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
        0, "seed for data generation, initialisation, shuffling and dropout", resume=REFUSED
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
        "trains nothing (0: no limit)",
        resume=APPLIED,
        at_least=0,
    )
    min_loss_scale: float = _opt(
        1.0,
        "amp fp16: stop the run (exit 1) when a gradient overflow would take GradScaler's loss "
        "scale below this (its gradients are non-finite at every scale that helps)",
        resume=APPLIED,
        above=0,
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
        "loss rides the next step's agreement: no collective of its own); 0: evaluations only",
        resume=APPLIED,
        at_least=0,
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
        "seconds without progress before a rank is declared hung "
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


def _field_type(f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]


def _number(text: str, kind: type) -> Any:
    """``1e-3``, ``3E-4``, ``1e4`` as numbers: PyYAML reads exponents without a dot as strings.

    Anything that is not a number (or, for an int field, not a whole one) is returned as is,
    so the caller's type check names the field.
    """
    try:
        number = float(text.strip())
    except ValueError:
        return text
    if not math.isfinite(number):  # "nan", "inf": not a setting anyone means
        return text
    if kind is int:
        return int(number) if number.is_integer() else text
    return number


def _coerce(name: str, value: Any) -> Any:
    """Check one raw value (from YAML or a checkpoint) against its field's type and choices."""
    f = FIELDS[name]
    kind = _field_type(f)
    if f.metadata["items"] and isinstance(value, list | tuple):  # a YAML list
        value = ",".join(str(v) for v in value)
    if kind in (int, float) and isinstance(value, str):
        value = _number(value, kind)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is bool and not isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"{name}: expected int, got {value!r}")
    choices = f.metadata["choices"]
    if choices and value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    items = f.metadata["items"]
    for item in list_items(value) if items else ():
        if item not in items:
            raise ConfigError(f"{name}: {item!r} is not one of {', '.join(items)}")
    return value


def list_items(value: str) -> list[str]:
    """A comma-separated list field's items, in order, without blanks or repeats."""
    found = [item.strip() for item in value.split(",")]
    return list(dict.fromkeys(item for item in found if item))


def check_keys(keys: Any, source: str) -> None:
    for key in keys:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{source}: unknown key {key!r}{hint}")


def load_yaml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(f"--config: file not found: {path}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option: value")
    check_keys(data, path)
    return {k: _coerce(k, v) for k, v in data.items()}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other config error
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m refddp.train",
        description="Reference DDP trainer. Every option is also a YAML key of --config.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="YAML file of options (CLI flags override it)")
    for f in FIELDS.values():
        flag = "--" + f.name.replace("_", "-")
        kind = _field_type(f)
        help_text = f"{f.metadata['help']} (default: {f.default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            choices = f.metadata["choices"] or None
            parser.add_argument(flag, type=kind, choices=choices, help=help_text, metavar=None)
    return parser


def parse_cli(argv: list[str]) -> tuple[dict[str, Any], str | None]:
    """The options given on the command line (only those), and the --config path if any."""
    values = vars(build_parser().parse_args(argv))
    return {k: v for k, v in values.items() if k != "config"}, values.get("config")


def merge(
    cli: dict[str, Any], from_yaml: dict[str, Any], from_checkpoint: dict[str, Any] | None = None
) -> TrainConfig:
    """CLI flag > YAML > checkpoint config (run fields only) > default; then validate."""
    values: dict[str, Any] = {}
    for key, value in (from_checkpoint or {}).items():
        if key in RUN_FIELDS:
            values[key] = _coerce(key, value)
    values.update(from_yaml)
    values.update(cli)
    refuse_checkpoint_imports(values, {**from_yaml, **cli})
    config = TrainConfig(**values)
    validate(config)
    return config


def is_import_path(spec: str) -> bool:
    """``package.module:callable`` (and not a ``.pt`` file path that happens to hold a colon)."""
    return ":" in spec and not spec.endswith((".pt", ".pth"))


def refuse_checkpoint_imports(values: dict[str, Any], from_user: dict[str, Any]) -> None:
    """Never import code that only a checkpoint names: the user names it, or trusts the file.

    A checkpoint is data; loading one (resume, eval, predict, init_from) must not run code.
    Every config that inherits from a checkpoint passes through ``merge``, hence through here,
    and so do the fields a rank takes from rank 0 (``refddp.train.take_rank0_run_config``).
    """
    if from_user.get("trust_checkpoint_code"):
        return
    for name in IMPORT_FIELDS:
        spec = values.get(name)
        if isinstance(spec, str) and is_import_path(spec) and name not in from_user:
            flag = name.replace("_", "-")
            raise ConfigError(
                f"{name}: refused to import {spec!r}: only the checkpoint names it; pass "
                f"--{flag} {spec} (or set it in --config) or --trust-checkpoint-code to allow it"
            )


def validate(c: TrainConfig) -> None:
    """Checks that need no world size, file or device; each error names its field."""
    for name in FIELDS:
        _coerce(name, getattr(c, name))
    for name, f in FIELDS.items():
        _check_bounds(name, getattr(c, name), f.metadata)


    positive = ("train_size", "val_size", "input_dim", "hidden_size", "batch_size", "grad_accum")
    for name in positive:
        if getattr(c, name) < 1:
            raise ConfigError(f"{name}: must be >= 1, got {getattr(c, name)}")
    non_negative = (
        "nproc",
        "max_restarts",
        "depth",
        "epochs",
        "max_steps",
        "global_batch_size",
        "warmup_steps",
        "num_workers",
        "ckpt_every",
        "eval_every",
        "stop_after",
        "log_every",
        "weight_decay",
        "grad_clip",
        "momentum",
        "augment",
    )
    for name in non_negative:
        if getattr(c, name) < 0:
            raise ConfigError(f"{name}: must be >= 0, got {getattr(c, name)}")
    if c.num_classes < 2:
        raise ConfigError(f"num_classes: must be >= 2, got {c.num_classes}")
    if not 0 <= c.dropout < 1:
        raise ConfigError(f"dropout: must be in [0, 1), got {c.dropout}")
    if not c.lr > 0:
        raise ConfigError(f"lr: must be > 0, got {c.lr}")
    if not c.timeout > 0:
        raise ConfigError(f"timeout: must be > 0 seconds, got {c.timeout}")
    if c.epochs == 0 and c.max_steps == 0 and c.task == "train":
        raise ConfigError("epochs: must be >= 1 unless max_steps is set")
    if c.strategy == "fsdp" and c.amp == "fp16":
        raise ConfigError(
            "amp: fp16 needs a gradient scaler for sharded gradients; use --amp bf16 (or off) "
            "with --strategy fsdp"
        )
    if c.strategy == "fsdp" and c.sync_bn:
        raise ConfigError("sync_bn: not supported with --strategy fsdp yet; use --strategy ddp")
    if c.strategy == "fsdp":
        from refddp.config.torch_support import fsdp2_refused  # imports torch: only when asked

        refused = fsdp2_refused()
        if refused:
            raise ConfigError(f"{refused}; use --strategy ddp")
    if c.profile:
        profile_window(c.profile)
    if c.amp != "off" and c.dtype == "float64":
        raise ConfigError(f"amp: {c.amp} needs dtype float32, got dtype float64")
    if c.resume not in ("auto", "never") and not _is_checkpoint_path(c.resume):
        raise ConfigError(
            f"resume: expected auto, never, a .pt/.pth file or a .dcp directory, got {c.resume!r}"
        )
    if c.init_from and not _is_checkpoint_path(c.init_from):
        raise ConfigError(
            f"init_from: expected a .pt/.pth checkpoint file or a .dcp directory, "
            f"got {c.init_from!r}"
        )


def _check_bounds(name: str, value: Any, policy: dict[str, Any]) -> None:
    """The field's declared bounds, one line naming it (``not >``: NaN fails too)."""
    low, above, below = policy["at_least"], policy["above"], policy["below"]
    if below is not None and not (low <= value < below):
        raise ConfigError(f"{name}: must be in [{low}, {below}), got {value}")
    if low is not None and value < low:
        raise ConfigError(f"{name}: must be >= {low}, got {value}")
    if above is not None and not value > above:
        raise ConfigError(f"{name}: must be > {above}{policy['unit']}, got {value}")


def has_fused_kernel(c: TrainConfig) -> bool:
    """Whether torch has a fused kernel for this optimizer under this strategy: not SGD over
    FSDP's sharded parameters (CUDA uses one where it can: ``trainer.fuses_on_cuda``)."""
    return not (c.strategy == "fsdp" and c.optimizer == "sgd")


def profile_window(spec: str) -> tuple[int, int]:
    """``--profile START:END`` as (START, END): training steps, 1 <= START <= END."""
    start, sep, end = spec.partition(":")
    try:
        window = (int(start), int(end)) if sep else None
    except ValueError:
        window = None
    if window is None or not 1 <= window[0] <= window[1]:
        raise ConfigError(
            f"profile: expected START:END, training steps with 1 <= START <= END (say 5:8), "
            f"got {spec!r}"
        )
    return window


def _is_checkpoint_path(path: str) -> bool:
    return path.rstrip("/").endswith((".pt", ".pth", ".dcp"))


def per_rank_batch_size(c: TrainConfig, world_size: int) -> int:
    """The micro-batch each rank loads, from batch_size or from global_batch_size."""
    if not c.global_batch_size:
        return c.batch_size
    parts = world_size * c.grad_accum
    if c.global_batch_size % parts:
        raise ConfigError(
            f"global_batch_size: {c.global_batch_size} does not divide by world size {world_size}"
            f" x grad_accum {c.grad_accum} = {parts}"
        )
    return c.global_batch_size // parts


def save_yaml(c: TrainConfig, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(c.to_dict(), f, sort_keys=False)
