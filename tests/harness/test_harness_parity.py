"""Parity assertions (replicas equal, distributed equals one process), DistributedTestCase, and
nothing a test builds on a warm rank reaching the next test."""

import copy
import os
import time
import unittest

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from refddp.config.torch_support import torch_version
from refddp.testing import (
    RankFailure,
    RankTimeout,
    assert_matches_single_process,
    assert_replicas_equal,
)


def replicas(perturb_rank, name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    if dist.get_rank() == perturb_rank:
        with torch.no_grad():
            dict(model.named_parameters(), **dict(model.named_buffers()))[name].add_(0.5)
    assert_replicas_equal(model)


def test_equal_replicas_pass(spawn):
    assert spawn(replicas, None, "", world_size=3) == [None] * 3  # no rank raised


@pytest.mark.parametrize(
    ("name", "said"),
    [("1.weight", "parameter 1.weight"), ("1.running_mean", "buffer 1.running_mean")],
)
def test_a_replica_that_differs_names_the_tensor_and_the_rank(spawn, name, said):
    with pytest.raises(RankFailure) as info:
        spawn(replicas, 2, name, world_size=3)
    assert set(info.value.failures) == {0, 1, 2}, "every rank raises the same message"
    assert (f"AssertionError: replicas differ: {said} on rank(s) [2] is not rank 0's "
            "(max abs difference 0.5)") in info.value.failures[0]  # fmt: skip


def ddp_step_against_one_process(skew):
    """One DDP step on this rank's shard of a global batch, and one process's step on all of
    it; ``skew`` plants a bug on rank 1 (a learning rate of its own)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2, dtype=torch.float64)
    single = copy.deepcopy(model)
    ddp = DDP(model)
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    shard = slice(dist.get_rank() * 4, dist.get_rank() * 4 + 4)
    lr = 0.1 + (skew if dist.get_rank() == 1 else 0.0)
    for m, xs, ys, rate in ((ddp, x[shard], y[shard], lr), (single, x, y, 0.1)):
        nn.functional.mse_loss(m(xs), ys).backward()
        with torch.no_grad():
            for p in m.parameters():
                p -= rate * p.grad
    assert_matches_single_process(ddp.module, single)


def test_ddp_matches_one_process_on_the_global_batch(spawn):
    assert spawn(ddp_step_against_one_process, 0.0) == [None, None]  # no rank raised


def test_a_rank_that_diverges_from_one_process_is_named(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(ddp_step_against_one_process, 1e-3)
    said = info.value.failures[0]
    assert (
        "does not match one process on the global batch on rank(s) [1]: parameter weight: max abs"
        in said
    )
    assert "(rtol=1e-07, atol=1e-07 for torch.float64)" in said


def float32_sum_in_another_order():
    """A sum reduced across ranks vs one process's: equal up to float32 rounding only."""
    torch.manual_seed(0)
    values = torch.rand(1000) * 1000
    mine = values[dist.get_rank() :: 2].sum()
    dist.all_reduce(mine)
    assert_matches_single_process({"sum": mine}, {"sum": values.sum()})
    assert_matches_single_process({"sum": mine.double()}, {"sum": values.sum().double()},
                                  rtol=1e-6)  # fmt: skip


def test_tolerances_follow_the_dtype(spawn):
    assert spawn(float32_sum_in_another_order) == [None, None]  # no rank raised


# -- nothing leaks between tests on a warm pool ----------------------------------------------


def leave_a_mesh_and_a_subgroup():
    from refddp.launch.dist import device_mesh

    device_mesh("cpu", dist.get_world_size())
    dist.new_group([0, 1])
    return len(dist.distributed_c10d._world.pg_names)


def what_is_left():
    from torch.distributed.device_mesh import _mesh_resources

    import refddp.launch.dist

    names = dist.distributed_c10d._world.pg_names
    return len(refddp.launch.dist._meshes), len(_mesh_resources.mesh_stack), len(names)


def test_meshes_and_subgroups_a_test_leaves_are_released_before_the_next(spawn):
    _, _, groups_before = spawn(what_is_left)[0]
    pids = spawn(lambda: __import__("os").getpid())
    assert spawn(leave_a_mesh_and_a_subgroup)[0] > groups_before
    assert spawn(what_is_left) == [(0, 0, groups_before)] * 2
    assert spawn(lambda: __import__("os").getpid()) == pids, "cleaned, not recycled"
    assert spawn(leave_a_mesh_and_a_subgroup)[0] > groups_before, "a new subgroup still works"


_freed_inside: list = []  # rank-side, between tasks: the functions running when it was freed


def leave_a_used_subgroup():
    import traceback
    import weakref

    group = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=group)
    _freed_inside.clear()
    weakref.finalize(group, lambda: _freed_inside.extend(
        frame.name for frame in traceback.extract_stack()))  # fmt: skip


def where_the_left_group_was_freed():
    return "freed after the reply" if "free_destroyed" in _freed_inside else _freed_inside[:]


def test_a_group_a_test_leaves_is_freed_after_the_test_s_reply(spawn):
    # Freed in the task's own clean-up, a gloo group whose thread still releases the test's
    # last all-reduce could deadlock its rank on torch 2.5 (refddp/testing/rank/leftovers.py).
    spawn(leave_a_used_subgroup)
    assert spawn(where_the_left_group_was_freed) == ["freed after the reply"] * 2


def leave_a_rank_alone_in_an_untraced_collective():
    import torch.distributed._functional_collectives as funcol

    group = dist.new_group([0, 1])
    if dist.get_rank() == 1:
        return  # its group is destroyed and freed after this task: rank 0's connection closes
    funcol.all_reduce(torch.ones(4), "sum", group).sum().item()  # (waits)


def test_a_rank_left_alone_in_a_collective_the_check_cannot_see_fails_in_seconds(spawn):
    # A functional collective (DTensor's, a compiled graph's) writes no slot: what ends the
    # wait is the finished rank's group freed, its connections closed, soon after its task.
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(leave_a_rank_alone_in_an_untraced_collective, timeout=60)
    assert time.monotonic() - start < 30, "the connection closed, not the deadline"
    assert not isinstance(info.value, RankTimeout), str(info.value)
    assert set(info.value.failures) == {0}, str(info.value)


# -- DistributedTestCase ---------------------------------------------------------------------


def run_suite(case):
    import unittest

    result = unittest.TestResult()
    unittest.TestLoader().loadTestsFromTestCase(case).run(result)
    return result


def test_a_multiprocesstestcase_suite_runs_on_every_rank_after_changing_its_base_class():
    from tests.unittest_cases import AllReduceSuite, DefaultWorldSuite

    result = run_suite(AllReduceSuite)
    assert result.testsRun == 3
    assert [t._testMethodName for t, _ in result.failures] == ["test_fails_on_rank_1"]
    said = result.failures[0][1]
    assert "rank 1 failed first: AssertionError: " in said and "rank 1 disagrees" in said
    assert [(t._testMethodName, why) for t, why in result.skipped] == [("test_skipped", "not here")]
    assert not result.errors
    default = run_suite(DefaultWorldSuite)
    assert default.wasSuccessful() and default.testsRun == 1, "4 ranks, as MultiProcessTestCase"


def test_a_timeout_that_is_no_deadline_is_one_line_for_a_result_a_suite_made_itself():
    # Inside this pytest session too: the refusal goes to the result the suite passed (pytest's
    # own failure would leave this run with no error and skip the class's other methods).
    from refddp.testing import DistributedTestCase

    class NoDeadline(DistributedTestCase):  # its methods never run: refused before any rank
        timeout = float("nan")

        def test_one(self):
            pass

        def test_two(self):
            pass

    result = run_suite(NoDeadline)
    assert result.testsRun == 2 and not result.failures
    said = [text for _, text in result.errors]
    assert said == ["ValueError: NoDeadline.timeout: expected a number of seconds > 0, at most "
                    "a week, got nan\n"] * 2, said  # fmt: skip


def test_pytorch_style_tests_pass_with_only_the_base_class_changed():
    pytest.importorskip("expecttest")  # torch.testing._internal.common_utils needs it
    from tests.unittest_cases import TorchStyleSuite

    result = run_suite(TorchStyleSuite)
    assert not result.failures and not result.errors, result.failures + result.errors
    skipped = dict((t._testMethodName, why) for t, why in result.skipped)
    if torch_version() < (2, 13):  # gloo's reduce_scatter is newer than torch 2.5's
        skipped.pop("test_reduce_scatter_with_a_part_of_its_own_size_on_each_rank", None)
    assert skipped == {"test_needs_two_gpus": "Need at least 2 CUDA devices",
                       "test_exits_with_a_skip_code": "Need at least 4 CUDA devices"}, skipped
    assert result.testsRun == 9


def test_another_backend_starts_for_real_and_the_pools_group_comes_back(spawn):
    pytest.importorskip("expecttest")  # torch.testing._internal.common_utils needs it
    from tests.unittest_cases import OtherBackendsSuite, PoolGroupSuite, TorchStyleSuite

    ranks = spawn(os.getpid)  # the 2-rank pool the suites below run on
    for case in (OtherBackendsSuite, TorchStyleSuite):
        only = "test_init_process_group_for_all_backends" if case is OtherBackendsSuite else \
            "test_a_fake_group_starts_for_real_and_the_pools_comes_back"  # fmt: skip
        result = unittest.TestResult()
        case(only).run(result)
        assert result.testsRun == 1 and result.wasSuccessful(), result.failures + result.errors
    assert spawn(os.getpid) == ranks, "the same ranks: the pool's group joined again, kept warm"
    after = run_suite(PoolGroupSuite)
    failed = {t._testMethodName: text for t, text in after.failures}
    assert failed.keys() == {"test_mismatched_collectives_are_still_caught"}, after.errors
    assert "Detected mismatch between collectives" in failed[
        "test_mismatched_collectives_are_still_caught"]  # the fingerprint check is back too


def test_local_synchronisation_groups_pass_test_after_test_in_one_session():
    import unittest

    from tests.unittest_cases import TorchStyleSuite

    repeats = unittest.TestSuite(
        TorchStyleSuite("test_new_group_with_local_synchronisation") for _ in range(20)
    )
    result = unittest.TestResult()
    repeats.run(result)
    assert result.testsRun == 20 and result.wasSuccessful(), result.failures + result.errors


def test_the_headline_is_the_failing_assertion_and_a_failed_subtest_fails():
    pytest.importorskip("expecttest")
    from tests.unittest_cases import TorchStyleFailures

    result = run_suite(TorchStyleFailures)
    failed = {t._testMethodName: text for t, text in result.failures}
    assert failed.keys() == {"test_tensors_differ_on_rank_1", "test_a_subtest_fails_on_rank_1"}
    said = failed["test_tensors_differ_on_rank_1"]
    headline = next(line for line in said.splitlines() if "failed first" in line)
    assert "rank 1 failed first: AssertionError: Tensor-likes are not" in headline, said
    said = failed["test_a_subtest_fails_on_rank_1"]  # a failed subTest fails the test
    assert "rank 1 failed first: AssertionError: 1 != 0" in said, said
