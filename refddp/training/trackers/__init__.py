"""Where rank 0 sends a run's metrics (``--log-to``): one interface, one module per tracker.

``TRACKERS`` names each tracker's module; ``--log-to`` takes its choices from it. A module
provides ``TRACKER``, a ``refddp.training.trackers.base.Tracker`` subclass, and imports its optional
package only when a run uses it. Adding a tracker is one module and one line here.

The modules are imported by name, when first asked for: they import ``refddp.config.schema`` (a
missing extra is a ``ConfigError``), which imports this package for its choices, so this
module imports nothing of refddp's (``tests/project/test_import_graph.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

TRACKERS = {  # --log-to NAME: the module of its tracker
    "jsonl": "refddp.training.trackers.jsonl",  # history.jsonl: always on
    "tensorboard": "refddp.training.trackers.tensorboard",
    "wandb": "refddp.training.trackers.wandb",
}
NAMES = tuple(TRACKERS)
ALWAYS = "jsonl"


def tracker_class(name: str) -> Any:
    """The ``Tracker`` subclass ``--log-to name`` selects (its module imported now)."""
    return importlib.import_module(TRACKERS[name]).TRACKER
