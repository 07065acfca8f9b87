"""A configuration from the command line, a YAML file and a checkpoint, merged and validated.

Precedence: CLI flag > ``--config FILE.yaml`` > the loaded checkpoint's config (its run fields)
> default. Every field of ``TrainConfig`` is a flag (``--batch-size``; booleans also
``--no-...``) whose help is the field's own.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import yaml

from refddp.config.schema import FIELDS, RUN_FIELDS, ConfigError, TrainConfig
from refddp.config.validation import (
    check_keys,
    coerce,
    field_type,
    refuse_checkpoint_imports,
    validate,
)


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
    return {k: coerce(k, v) for k, v in data.items()}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other config error
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m refddp.train",
        description="Reference DDP trainer. Every option is also a YAML key of --config.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", action="append",
                        help="YAML file of options (CLI flags override it)")  # fmt: skip
    for f in FIELDS.values():
        flag = "--" + f.name.replace("_", "-")
        kind = field_type(f)
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
    files = values.get("config", [None])
    if len(files) > 1:  # a later one silently replacing the earlier would drop all of it
        raise ConfigError(f"--config is given {len(files)} times; give one file (flags override "
                          "it)")  # fmt: skip
    return {k: v for k, v in values.items() if k != "config"}, files[0]


def merge(
    cli: dict[str, Any], from_yaml: dict[str, Any], from_checkpoint: dict[str, Any] | None = None
) -> TrainConfig:
    """CLI flag > YAML > checkpoint config (run fields only) > default; then validate."""
    values: dict[str, Any] = {}
    given = {**from_yaml, **cli}
    for key, value in (from_checkpoint or {}).items():
        if key in RUN_FIELDS and key not in given:  # (what the user gives can mend a bad one)
            try:
                values[key] = coerce(key, value)
            except ConfigError as exc:
                raise ConfigError(f"checkpoint: {exc} (pass --{key.replace('_', '-')} to "
                                  "replace it)") from None  # fmt: skip
    values.update(from_yaml)
    values.update(cli)
    refuse_checkpoint_imports(values, given)
    config = TrainConfig(**values)
    validate(config)
    return config


def save_yaml(c: TrainConfig, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(c.to_dict(), f, sort_keys=False)
