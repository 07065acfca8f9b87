"""Coverage of code that only ranks run, through pytester with pytest-cov as a project uses it:
ranks measure with the session's settings and stop before pytest-cov combines."""

import re

import pytest

pytest.importorskip("pytest_cov")

HELPER = """
import os
import signal
import threading


def scaled(rank):
    doubled = rank * 2
    return doubled + 1


def seen_by_rank_0():
    return "rank 0 was here"


def wait_forever():
    never = threading.Event()
    never.wait()


def die():
    os.kill(os.getpid(), signal.SIGKILL)  # pragma: no cover - its rank never saves
"""

TESTS = """
import pytest
import torch.distributed as dist

import helper
from refddp.testing import RankFailure, RankTimeout


def rank_0_works_then_rank_1_dies():
    if dist.get_rank() == 0:
        helper.seen_by_rank_0()
        dist.barrier()
    else:
        helper.die()


def test_a_killed_rank_loses_only_its_own_data(spawn):
    with pytest.raises(RankFailure, match="killed by signal SIGKILL"):
        spawn(rank_0_works_then_rank_1_dies)



def rank_0_waits_forever():
    if dist.get_rank() == 0:
        helper.wait_forever()


def test_a_rank_stopped_while_busy_saves_its_data(spawn):
    with pytest.raises(RankTimeout):
        spawn(rank_0_waits_forever, timeout=2)


# Last: its ranks are still warm when the session ends, and must save before pytest-cov combines.
@pytest.mark.multiproc
def test_rank_side(dist_ctx):
    assert helper.scaled(dist_ctx.rank) == 2 * dist_ctx.rank + 1
"""


def helper_coverage(result) -> str:
    lines = [ln for ln in result.stdout.lines if re.match(r"helper\.py\s", ln)]
    assert lines, result.stdout.str()
    return lines[0]


@pytest.mark.slow  # two projects' suites under coverage: 17-25 s
@pytest.mark.heavy
@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_lines_only_ranks_run_are_covered(pytester, xdist):
    pytester.makepyfile(helper=HELPER, test_ranks=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cov=helper", "--cov-report=term-missing", *xdist, timeout=240
    )
    result.assert_outcomes(passed=3)
    # seen_by_rank_0() ran on rank 0 only, in the test where rank 1 was killed; wait_forever()
    # on a rank the driver stopped at the deadline; scaled() on ranks warm at session end.
    assert re.search(r"\s0\s+100%$", helper_coverage(result)), helper_coverage(result)
