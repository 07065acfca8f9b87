"""``Cluster``'s argument checks, which need no nodes: they run on every machine, where the
cluster tests (``test_cluster.py``) skip without root or user namespaces."""

from __future__ import annotations

import math

import pytest

from refddp.testing.cluster import throttle_error


@pytest.mark.parametrize(("share", "period_s", "field"), [
    (0.5, math.nan, "period_s"), (0.5, math.inf, "period_s"), (0.5, 0.0, "period_s"),
    (0.5, -0.02, "period_s"), (0.5, "0.02", "period_s"), (math.nan, 0.02, "share"),
    (1.0, 0.02, "share"), (0.0, 0.02, "share"), ("0.5", 0.02, "share"),
])  # fmt: skip
def test_a_throttle_that_could_not_run_is_named_by_its_argument(share, period_s, field):
    # A NaN period raised in the duty cycle's thread: the node ran at full speed while the
    # test believed it slow.
    assert throttle_error(share, period_s).startswith(field)


@pytest.mark.parametrize(("share", "period_s"), [(0.5, 0.02), (0.01, 1e-3), (0.99, 5)])
def test_a_throttle_that_can_run_passes(share, period_s):
    assert throttle_error(share, period_s) == ""
