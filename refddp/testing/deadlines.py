"""What a test's deadline may be, checked where the harness is given one (pytest's
``--dist-timeout``, ``multiproc(timeout=...)``, ``spawn(timeout=...)``,
``DistributedTestCase.timeout``). Imports nothing heavy: the plugin loads it in every pytest
session, distributed tests or not.
"""

from __future__ import annotations

import math
from typing import Any

MAX_DEADLINE_S = 7 * 24 * 3600


def deadline_error(value: Any) -> str:
    """Why ``value`` is no test deadline ("" if it is one): a finite number of seconds > 0 (a
    NaN deadline crashed the driver's wait, a negative one failed every test at once as a
    hang)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        return f"expected a finite number of seconds > 0, got {value!r}"
    if seconds > MAX_DEADLINE_S:  # (past the waits' own limits: an OverflowError in the driver)
        return f"expected at most {MAX_DEADLINE_S} seconds (a week), got {value!r}"
    return ""
