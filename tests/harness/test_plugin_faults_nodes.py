"""Faults, simulated nodes, any callable and DistributedTestCase through pytester, as a project
runs them: plainly, under xdist and under coverage."""

import re

import pytest

HELPER = """
from refddp.testing import fault_point


def save_step(rank):
    fault_point("save")
    return rank + 1
"""

TESTS = """
import os
import socket

import pytest
import torch
import torch.distributed as dist

import helper
from refddp.testing import DistributedTestCase
from refddp.testing import faults


@pytest.mark.multiproc
@pytest.mark.faults(faults.kill(1, 2))
def test_killed_inside_the_second_collective(dist_ctx):
    for _ in range(3):
        dist.all_reduce(torch.ones(1))


@pytest.mark.multiproc
@pytest.mark.faults(faults.delay(0, "save", 0.2))
def test_a_straggler_passes(dist_ctx):
    assert helper.save_step(dist_ctx.rank) == dist_ctx.rank + 1


@pytest.mark.multiproc
@pytest.mark.nodes(2)
@pytest.mark.world_size(4)
def test_two_nodes(dist_ctx, tmp_path):
    assert (dist_ctx.node_rank, dist_ctx.local_rank) == divmod(dist_ctx.rank, 2)
    assert dist_ctx.local_world_size == 2 == int(os.environ["LOCAL_WORLD_SIZE"])
    (dist_ctx.node_tmp_path / f"rank{dist_ctx.rank}").touch()
    (tmp_path / f"rank{dist_ctx.rank}").touch()
    dist.barrier()
    assert len(os.listdir(dist_ctx.node_tmp_path)) == 2 and len(os.listdir(tmp_path)) == 4
    assert socket.gethostname().endswith(f"-node{dist_ctx.node_rank}")


@pytest.mark.multiproc
@pytest.mark.nodes(2)
@pytest.mark.world_size(3)
def test_nodes_that_do_not_divide_the_world(dist_ctx):
    pass


def test_a_lambda_and_a_closure(spawn):
    scale = 3
    assert spawn(lambda: dist.get_rank() * scale) == [0, 3]


class TestFromMultiProcessTestCase(DistributedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_all_reduce(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                rank=self.rank, world_size=self.world_size)
        t = torch.ones(1) * self.rank
        dist.all_reduce(t)
        self.assertEqual(t.item(), 1.0)
        dist.destroy_process_group()

    def test_fails_on_rank_1(self):
        self.assertEqual(self.rank, 0)
"""


@pytest.mark.parametrize(
    "args",
    [(), ("-n", "2"), ("--cov=helper", "--cov-report=term-missing")],
    ids=["plain", "xdist", "cov"],
)
@pytest.mark.heavy  # a project's suite, under -n 2 too
def test_faults_nodes_callables_and_unittest_suites_in_a_project(pytester, args):
    if "--cov=helper" in args:
        pytest.importorskip("pytest_cov")
    pytester.makepyfile(helper=HELPER, test_project=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)
    result.assert_outcomes(passed=4, failed=3)
    out = result.stdout.str()
    assert (
        "rank 1 failed first: killed by signal SIGKILL (injected: kill rank 1 at collective #2 "
        "all_reduce((1,):float32, SUM)) (world_size=2, backend=gloo)"
    ) in out
    assert "rank 0: waiting on rank 1 in #2 all_reduce((1,):float32, SUM) at " in out or (
        "rank 0: failed waiting on rank 1 in #2 all_reduce((1,):float32, SUM)" in out
    )
    assert "nnodes=2 does not divide world_size=3: every node runs the same number" in out
    assert re.search(r"rank 1 failed first: AssertionError: .*1 != 0", out), out
    if "--cov=helper" in args:
        helper = next(ln for ln in result.stdout.lines if re.match(r"helper\.py\s", ln))
        assert re.search(r"\s0\s+100%$", helper), helper  # save_step ran on ranks only
