"""The straggler report: each rank's compute and data wait ride the evaluation's all-reduce;
history names the slowest rank and its lag, and the log warns when the same rank stays
behind (``refddp/training/stragglers.py``)."""

import pytest

from refddp.training.stragglers import PERSISTENT
from tests.observability_tasks import fit_with_a_slow_rank

DELAY_S = 0.05  # per forward or backward: ~50x this tiny model's own compute per step, and
# more than a loaded machine's noise in a rank's mean step (0.02 read 0.10 once under -n 2)


# Slow in the backward too, where the backward only accumulates (grad_accum 2: the first of
# each step's two): the backward that all-reduces ends waiting for the slowest rank, so it is
# not timed with several ranks (docs/known-limitations.md).
@pytest.mark.parametrize(
    "slow_rank, phase, accum", [(0, "forward", 1), (1, "forward", 1), (1, "backward", 2)]
)
def test_a_rank_persistently_slower_is_named_in_history_and_warned_about(
    spawn, tmp_path, slow_rank, phase, accum
):
    found = spawn(fit_with_a_slow_rank, str(tmp_path / "run"), slow_rank, DELAY_S, phase,
                  eval_every=4, grad_accum=accum, batch_size=4 // accum)  # fmt: skip
    records = found[0]["records"]
    assert len(records) == 6  # 24 steps
    for record in records:
        assert record["slowest_rank"] == slow_rank, records
        # Its lag is its own delay: the others' compute stops at their gradients, not at the
        # end of the all-reduce that waits for the slow rank.
        assert DELAY_S * 0.5 < record["straggler_lag_s"] < DELAY_S * 3, records
        assert record["straggler_lag_share"] > 1
    warned = [w for w in found[0]["warnings"] if "is the slowest" in w]
    assert warned == [found[0]["warnings"][0]] and len(warned) == 1, "once per streak"
    assert warned[0].startswith(f"step {4 * PERSISTENT}: rank {slow_rank} is the slowest at "
                                f"{PERSISTENT} evaluations in a row")  # fmt: skip
    assert found[1]["records"] == [] and found[1]["warnings"] == [], "rank 0 reports"

