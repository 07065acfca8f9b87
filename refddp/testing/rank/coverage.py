"""Coverage inside ranks: when coverage.py measures the pytest process, ranks measure too.

The driver hands its running ``Coverage``'s configuration to each rank through
``COVERAGE_PROCESS_CONFIG`` (coverage.py's own variable for measuring subprocesses, 7.10+):
same sources, branch setting and rc file, parallel mode, and the driver's data file made
absolute, so each rank writes ``.coverage.<host>.<pid>.<random>`` next to the driver's and
the session's combine (pytest-cov's, or ``coverage combine``) picks it up. coverage's ``.pth``
hook starts measuring at the rank's interpreter start; ``start()`` covers installs without it.
A rank saves its data when told to stop, or on SIGTERM; one that is SIGKILLed loses only its own.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

ENV_VAR = "COVERAGE_PROCESS_CONFIG"


def _driver_coverage() -> Any:
    """The Coverage object measuring this process, or None (coverage is never imported here)."""
    coverage = sys.modules.get("coverage")
    if coverage is None:
        return None
    cov = coverage.Coverage.current()
    if cov is None or not getattr(cov, "_started", False):
        return None
    return cov


def rank_environment() -> dict[str, str]:
    """Environment entries that make a rank measure like this process ({} when not measured)."""
    cov = _driver_coverage()
    if cov is None or not hasattr(cov.config, "serialize"):
        return {}
    config = copy.copy(cov.config)
    config.parallel = True
    # The data file as the driver resolved it when it started, not against today's cwd.
    data = getattr(cov, "_data", None)
    config.data_file = (
        data.base_filename() if data is not None else os.path.abspath(cov.config.data_file)
    )
    return {ENV_VAR: config.serialize()}


def start() -> Any:
    """On a rank: the running Coverage (started here if the ``.pth`` hook did not), or None."""
    if ENV_VAR not in os.environ:
        return None
    try:
        import coverage
    except ImportError:
        return None
    coverage.process_startup()  # a no-op when the .pth hook already started it
    return coverage.Coverage.current()


def save(cov: Any) -> None:
    """On a rank: write this rank's data file now (before an ``os._exit``)."""
    if cov is None:
        return
    try:
        cov.stop()
    except Exception:  # noqa: BLE001 - stopping from a signal handler mid-trace may refuse
        pass
    cov.save()
