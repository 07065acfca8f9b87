"""``--metrics package.module:callable``: the user's validation metrics, exact at any world size.

Called as ``fn(outputs, batch)`` on every validation batch, it returns a dict of *sums* over
the batch: ``{"name": value}`` is reported as ``val_name``, the value summed over the whole
validation set; ``{"name": (value, count)}`` as the ratio of the two sums (a mean over
whatever ``count`` counts). refddp all-reduces the sums, so every sample counts once at any
world size, as for the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from refddp.config.schema import ConfigError


class UserMetrics:
    def __init__(self, spec: str, fn: Callable[[Any, Any], Any]):
        self.spec, self.fn = spec, fn
        self.names: list[str] = []
        self.ratios: set[str] = set()

    @property
    def sum_names(self) -> tuple[str, ...]:
        names = []
        for name in self.names:
            names.append(f"metric:{name}")
            if name in self.ratios:
                names.append(f"metric:{name}:count")
        return tuple(names)

    def check(self, outputs: Any, batch: Any) -> None:
        """Learn the metric names (and which are ratios) from a first batch."""
        found = self.fn(outputs, batch)
        if not isinstance(found, Mapping) or not found:
            raise ConfigError(
                f"metrics: {self.spec} must return a non-empty dict of name: sum (or name: "
                f"(sum, count)), got {type(found).__name__}"
            )
        self.names = sorted(map(str, found))
        self.ratios = {str(k) for k, v in found.items() if isinstance(v, tuple | list)}
        for key, value in found.items():
            parts = value if isinstance(value, tuple | list) else [value]
            numbers = all(isinstance(v, int | float) or _is_scalar(v) for v in parts)
            if not numbers or len(parts) > 2 or (key in self.ratios and len(parts) != 2):
                shown = f"{type(value).__name__} of {len(parts)}" if key in self.ratios else (
                    type(value).__name__)  # fmt: skip
                raise ConfigError(
                    f"metrics: {self.spec} returned {shown} for {key!r}; each value must be a "
                    "number or a scalar tensor (a sum over the batch), or a (sum, count) pair"
                )

    def eval_sums(self, outputs: Any, batch: Any) -> list[Any]:
        found = self.fn(outputs, batch)
        sums: list[Any] = []
        for name in self.names:
            if name not in found:
                raise RuntimeError(f"metrics: {self.spec} returned no {name!r} for a batch")
            sums += self._values(found[name], name)
        return sums

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        found = {}
        for name in self.names:
            value = sums[f"metric:{name}"]
            if name in self.ratios:
                count = sums[f"metric:{name}:count"]
                value = value / count if count else float("nan")
            found[f"val_{name}"] = value
        return found

    def _values(self, value: Any, name: str) -> list[Any]:
        if name in self.ratios:
            if not (isinstance(value, tuple | list) and len(value) == 2):
                raise RuntimeError(f"metrics: {self.spec}: {name!r} is (sum, count) on one batch, "
                                   "not on another")  # fmt: skip
            return [value[0], value[1]]
        return [value]


def _is_scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1
