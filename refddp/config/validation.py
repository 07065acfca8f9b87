"""The checks a configuration passes before anything runs, each error one line naming its field.

A raw value (from YAML, the command line or a checkpoint) is checked against its field's type,
choices and bounds, as ``TrainConfig`` declares them (``refddp/config/schema.py``); then the
checks across fields (``validate``), code a checkpoint alone names (``refuse_checkpoint_imports``),
and the values derived from the settings (the per-rank batch, the profiler's window).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from typing import Any

from refddp.config.schema import FIELDS, IMPORT_FIELDS, ConfigError, TrainConfig

# The longest timeout or deadline anywhere (the trainer's --timeout, the harness's, the
# doctor's): longer than any step, and within every wait's own limits (1e12 s overflowed them).
MAX_WAIT_S = 7 * 24 * 3600


def seconds_error(value: Any) -> str:
    """Why ``value`` is no timeout or deadline ("" if it is one): a number of seconds > 0, at
    most ``MAX_WAIT_S`` (a NaN deadline crashed the harness's wait, a negative one failed every
    test at once as a hang, 1e12 overflowed a wait after the ranks had started)."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number and 0 < value <= MAX_WAIT_S):  # (NaN fails too)
        return f"expected a number of seconds > 0, at most a week, got {value!r}"
    return ""


def field_type(f: dataclasses.Field) -> type:
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


def coerce(name: str, value: Any) -> Any:
    """Check one raw value (from YAML or a checkpoint) against its field's type and choices."""
    f = FIELDS[name]
    kind = field_type(f)
    if f.metadata["items"] and isinstance(value, list | tuple):  # a YAML list
        value = ",".join(str(v) for v in value)
    if kind in (int, float) and isinstance(value, str):
        value = _number(value, kind)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:  # (a YAML integer too large for a float)
            value = math.inf
    if kind is bool and not isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"{name}: expected int, got {value!r}")
    if kind is float and not math.isfinite(value):  # YAML's .nan and .inf, the CLI's "nan"
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
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
        coerce(name, getattr(c, name))
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
    if c.timeout > MAX_WAIT_S:  # (1e12 overflowed a wait's deadline on every rank)
        raise ConfigError(
            f"timeout: must be at most {MAX_WAIT_S} seconds (a week), got {c.timeout}"
        )
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
    """The field's declared bounds, one line naming it (``>=``, ``>``, ``<``: NaN fails too)."""
    low, above, below = policy["at_least"], policy["above"], policy["below"]
    if not ((low is None or value >= low) and (above is None or value > above)
            and (below is None or value < below)):  # fmt: skip
        text = bounds_text(policy, policy["unit"])
        raise ConfigError(f"{name}: must be {'in ' if text[0] in '[(' else ''}{text}, "
                          f"got {value}")


def bounds_text(policy: dict[str, Any], unit: str = "") -> str:
    """A field's declared bounds as its error and docs/configuration.md write them: ``[0,
    1)``, ``(0, 65536)``, ``< 65536``, ``>= 1``, ``> 0`` (``unit`` after a lower bound it
    may not reach); empty where it declares none."""
    low, above, below = policy["at_least"], policy["above"], policy["below"]
    if below is not None and above is not None:
        return f"({above}, {below})"
    if below is not None:
        return f"[{low}, {below})" if low is not None else f"< {below}"
    return "; ".join([f">= {low}"] * (low is not None) + [f"> {above}{unit}"] * (above is not None))


def has_fused_kernel(c: TrainConfig) -> bool:
    """Whether torch has a fused kernel for this optimizer under this strategy: not SGD over
    FSDP's sharded parameters (CUDA uses one where it can:
    ``refddp.training.run_setup.fuses_on_cuda``)."""
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
