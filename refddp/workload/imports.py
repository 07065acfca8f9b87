"""Resolving user code named as ``package.module:callable``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from refddp.config.schema import ConfigError


def load_callable(spec: str, field: str) -> Callable[..., Any]:
    """Import ``package.module:callable``; a user error names the field and what failed."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({exc})") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise ConfigError(f"{field}: {spec!r} is not callable")
    return target
