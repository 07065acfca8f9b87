"""Faults injected at the k-th collective or a named point, and the report that names the rank
that failed first among the ranks left waiting on it."""

import os
import re
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure, RankTimeout, fault_point, faults
from refddp.testing.rank_lists import parse_rank_list
from tests.harness.test_harness import assert_pool_healthy
from tests.rank_tasks import raises_after_one_all_reduce

SIGNATURE = "all_reduce((1,):float32, SUM)"


def five_all_reduces(record_dir):
    """Five all-reduces; after each completes, this rank appends its number to its record."""
    for i in range(1, 6):
        t = torch.ones(1)
        dist.all_reduce(t)
        with open(os.path.join(record_dir, f"rank{dist.get_rank()}"), "a") as f:
            f.write(f"{i}\n")
    return t.item()


def completed(record_dir, rank):
    path = record_dir / f"rank{rank}"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize(
    ("fault", "how"),
    [
        (faults.kill(1, 3), "killed by signal SIGKILL"),
        (faults.error(1, 3, "injected boom"), "RuntimeError: injected boom"),
        (faults.exit(1, 3, 7), "exited with code 7"),
    ],
    ids=["kill", "error", "exit"],
)
def test_a_fault_fires_inside_collective_k_after_every_rank_finished_those_before(
    spawn, tmp_path, fault, how
):
    with pytest.raises(RankFailure) as info:
        spawn(five_all_reduces, str(tmp_path), faults=[fault], timeout=60)
    report = str(info.value)
    assert info.value.cause == 1
    assert report.startswith(
        f"rank 1 failed first: {how} (injected: {fault.kind} rank 1 at collective #3 {SIGNATURE})"
    ), report.splitlines()[0]
    # Collectives 1 and 2 completed on every rank; the 3rd on none: rank 1 was inside it.
    assert completed(tmp_path, 0) == completed(tmp_path, 1) == ["1", "2"]
    assert f"rank 0: waiting on rank 1 in #3 {SIGNATURE} at " in report or (
        f"rank 0: failed waiting on rank 1 in #3 {SIGNATURE}" in report
    ), report
    assert_pool_healthy(spawn)


def test_a_hang_fault_blocks_rank_k_and_the_deadline_names_it(spawn, tmp_path):
    started = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        spawn(five_all_reduces, str(tmp_path), faults=[faults.hang(1, 2)], timeout=3)
    assert time.monotonic() - started < 30
    assert info.value.cause == 1
    assert f"injected: hang rank 1 at collective #2 {SIGNATURE}" in str(info.value)
    assert completed(tmp_path, 0) == completed(tmp_path, 1) == ["1"]
    assert f"last collective entered: #2 {SIGNATURE}" in info.value.failures[0]
    assert_pool_healthy(spawn)


def timed_all_reduces():
    """The time each of three all-reduces took on this rank."""
    took = []
    for _ in range(3):
        start = time.monotonic()
        dist.all_reduce(torch.ones(1))
        took.append(time.monotonic() - start)
    return took


def test_a_delay_makes_rank_k_a_straggler_and_the_test_passes(spawn):
    took = spawn(timed_all_reduces, faults=[faults.delay(1, 2, 1.5)])
    rank0 = took[0]
    assert rank0[1] >= 1.4, f"rank 0 waited in #2 for the straggler: {rank0}"
    assert rank0[0] < 1.0 and rank0[2] < 1.0, f"only #2 was late: {rank0}"
    assert took[1][1] >= 1.4, "the straggler's own #2 includes its delay"


def test_a_fault_that_never_fires_fails_the_test(spawn, tmp_path):
    with pytest.raises(RankFailure) as info:
        spawn(five_all_reduces, str(tmp_path), faults=[faults.delay(1, 9, 0.1)])
    assert str(info.value).startswith(
        "fault never fired: delay rank 1 at collective #9 (rank 1 entered 5 collective(s))"
    ), str(info.value)
    assert_pool_healthy(spawn)


def named_points():
    fault_point("before the step")
    dist.barrier()
    fault_point("after the step")
    return dist.get_rank()


def test_a_fault_at_a_named_point_fires_there(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(named_points, faults=[faults.kill(0, "after the step")])
    assert info.value.cause == 0
    assert str(info.value).startswith(
        "rank 0 failed first: killed by signal SIGKILL (injected: kill rank 0 at fault point "
        "'after the step')"
    )
    assert spawn(named_points, faults=[faults.delay(1, "before the step", 0.1)]) == [0, 1]


def test_a_fault_point_outside_the_harness_does_nothing():
    assert fault_point("anything") is None  # no rank, no armed fault: returns at once


def test_bad_faults_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^faults.kill: at must be a collective number >= 1"):
        faults.kill(1, 0)
    with pytest.raises(ValueError, match=r"^faults.delay: rank must be an int >= 0"):
        faults.delay(-1, 2, 1.0)
    with pytest.raises(ValueError, match=r"^faults.kill: rank must be an int >= 0, not True"):
        faults.kill(True, 1)  # (a bool is an int to Python: rank 1 would have been killed)
    for seconds in (float("nan"), float("inf"), -1, 1e12, "1", True):  # (sleep fails in the rank)
        with pytest.raises(ValueError, match=r"^faults.delay: seconds must be a number >= 0, at"):
            faults.delay(0, 1, seconds)
    for code in (256, 300, -1, True, 1.0):  # (300 would exit as 44)
        with pytest.raises(ValueError, match=r"^faults.exit: code must be an int from 0 to 255"):
            faults.exit(0, 1, code)
    assert faults.exit(0, 1, 255).value == 255
    assert faults.delay(1, 2, 0).value == 0.0
    assert faults.delay(1, 2, np.float32(0.5)).value == 0.5  # (numpy's numbers are numbers)


def test_a_fault_on_a_rank_outside_the_world_is_refused(spawn):
    with pytest.raises(
        ValueError, match=r"^kill rank 5 at collective #1: no rank 5 in a world of 2"
    ):
        spawn(named_points, faults=[faults.kill(5, 1)])


# -- the cause among the victims -------------------------------------------------------------


def test_the_rank_that_failed_first_is_named_and_the_ranks_waiting_on_it_listed(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(raises_after_one_all_reduce, 2, world_size=3, timeout=60)
    lines = str(info.value).splitlines()
    assert info.value.cause == 2
    assert lines[0] == (
        "rank 2 failed first: ValueError: rank 2's own bug (world_size=3, backend=gloo)"
    )
    # The two victims say the same thing: one line names both.
    assert lines[1].startswith(f"    ranks [0, 1] (2): waiting on rank 2 in #2 {SIGNATURE} at ")
    assert "in raises_after_one_all_reduce" in lines[1]


def test_several_faults_that_fire_are_each_named_with_the_rank_they_ended(spawn, tmp_path):
    # Whichever is found first, the other rank's end is its own fault, not a wait on it.
    planted = [faults.error(0, 2, "rank 0's fault"), faults.kill(1, 2)]
    with pytest.raises(RankFailure) as info:
        spawn(five_all_reduces, str(tmp_path), faults=planted, world_size=3, timeout=60)
    report = str(info.value)
    for fault in planted:
        assert f"injected: {fault.describe()}" in report, report
    other = 1 - info.value.cause
    line = next(ln for ln in report.splitlines() if ln.startswith(f"    rank {other}: "))
    assert "also failed" in line and "waiting on" not in line, line


def sigkill_rank_1_after_one_all_reduce():
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        os.kill(os.getpid(), 9)
    dist.barrier()


def test_a_killed_rank_is_the_cause_not_the_ranks_its_death_broke(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(sigkill_rank_1_after_one_all_reduce, world_size=3, timeout=60)
    assert info.value.cause == 1
    report = str(info.value)
    assert report.startswith("rank 1 failed first: killed by signal SIGKILL ("), report
    # Each victim waits, or has failed waiting (its connection reset): alone or grouped.
    victims = set()
    for line in report.splitlines():
        found = re.match(r"    ranks? (\d+|\[[^\]]*\])(?: \(\d+\))?: (?:failed )?waiting on rank 1 in "
                         r"#2 barrier\(\)", line)  # fmt: skip
        if found:
            victims |= set(parse_rank_list(found[1]))
    assert victims == {0, 2}, report


def mismatched():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2))
    else:
        dist.broadcast(torch.ones(2), src=0)


def test_ranks_that_disagree_on_a_collective_have_no_single_cause(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(mismatched, timeout=60)
    assert info.value.cause is None
    # What they disagree on, told to both, is the headline's own.
    assert str(info.value).splitlines()[0].startswith(
        "rank(s) [0, 1] failed: refddp.testing.checks.fingerprint.CollectiveMismatch: Detected "
        "mismatch between collectives on ranks: rank 0 is running #1 all_reduce("
    ), str(info.value)


def victim_wraps_the_collective_s_error():
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        os.kill(os.getpid(), 9)
    try:
        dist.barrier()
    except RuntimeError as exc:  # a training loop's own wrapping: still a victim
        raise RuntimeError("step failed") from exc


def test_a_victim_that_wraps_its_collective_s_error_is_still_a_victim(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(victim_wraps_the_collective_s_error, timeout=60)
    assert info.value.cause == 1
    assert "rank 0: also failed" not in str(info.value), str(info.value)
