"""Coverage of code that only ranks run, through pytester with pytest-cov as a project uses it:
ranks measure with the session's settings and stop before pytest-cov combines."""

import re

import pytest

pytest.importorskip("pytest_cov")

HELPER = """
import os
import signal


def scaled(rank):
    doubled = rank * 2
    return doubled + 1


def seen_by_rank_0():
    return "rank 0 was here"


def die():
    os.kill(os.getpid(), signal.SIGKILL)  # pragma: no cover - its rank never saves
"""

TESTS = """
import pytest
import torch.distributed as dist

import helper
from refddp.testing import RankFailure


@pytest.mark.multiproc
def test_rank_side(dist_ctx):
    assert helper.scaled(dist_ctx.rank) == 2 * dist_ctx.rank + 1


def rank_0_works_then_rank_1_dies():
    if dist.get_rank() == 0:
        helper.seen_by_rank_0()
        dist.barrier()
    else:
        helper.die()


def test_a_killed_rank_loses_only_its_own_data(spawn):
    with pytest.raises(RankFailure, match="killed by signal SIGKILL"):
        spawn(rank_0_works_then_rank_1_dies)
"""


def helper_coverage(result) -> str:
    lines = [ln for ln in result.stdout.lines if re.match(r"helper\.py\s", ln)]
    assert lines, result.stdout.str()
    return lines[0]


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_lines_only_ranks_run_are_covered(pytester, xdist):
    pytester.makepyfile(helper=HELPER, test_ranks=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cov=helper", "--cov-report=term-missing", *xdist, timeout=240
    )
    result.assert_outcomes(passed=2)
    # seen_by_rank_0() ran on rank 0 only, in the test where rank 1 was killed.
    assert re.search(r"\s0\s+100%$", helper_coverage(result)), helper_coverage(result)
