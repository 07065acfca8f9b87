"""The harness catches every classic distributed failure, by rank, fast, and then recovers."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure, RankTimeout, record_collectives
from refddp.testing.driver import tasks
from refddp.testing.driver.warm_pools import PoolKey, _pools

GENEROUS_DEADLINE = 120.0  # the failure tests must finish far sooner than this


def rank_sum(offset):
    t = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(t)
    return t.item()


def whoami():
    return dist.get_rank(), dist.get_world_size(), os.getpid()


def raise_on_rank_1():
    print(f"rank {dist.get_rank()} about to meet")
    if dist.get_rank() == 1:
        raise ValueError("planted failure on rank 1")
    dist.barrier()


def fail_one_after_another(gap_s):
    dist.barrier()
    time.sleep(gap_s * dist.get_rank())
    raise ValueError(f"rank {dist.get_rank()} fails in turn")


def exit_on_rank_1():
    if dist.get_rank() == 1:
        os._exit(7)
    dist.barrier()


def sigkill_rank_1():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def progress_bar_barrier():
    # The classic: rank-0-only work that contains a collective.
    if dist.get_rank() == 0:
        dist.barrier()
    return "done"


def mismatched_order():
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def mismatched_shapes():
    dist.all_reduce(torch.ones(3 + dist.get_rank()))


def destroy_group():
    dist.destroy_process_group()


def env_var(name):
    return os.environ.get(name)


def traced_step():
    with record_collectives() as log:
        dist.all_reduce(torch.ones(2, 3), op=dist.ReduceOp.MAX)
        dist.broadcast(torch.zeros(5, dtype=torch.int64), src=0)
        dist.barrier()
    return log


def assert_pool_healthy(spawn, world_size=2):
    expected = sum(range(world_size)) + world_size
    assert spawn(rank_sum, 1, world_size=world_size) == [float(expected)] * world_size


def test_results_come_back_ordered_by_rank(spawn):
    results = spawn(whoami, world_size=3)
    assert [r[:2] for r in results] == [(0, 3), (1, 3), (2, 3)]
    assert len({r[2] for r in results}) == 3


def test_warm_pool_is_reused_between_calls(spawn):
    first = {pid for _, _, pid in spawn(whoami)}
    second = {pid for _, _, pid in spawn(whoami)}
    assert first == second


def test_ranks_failing_one_after_another_are_all_reported_failed_not_still_running(
    spawn, monkeypatch
):
    # Each failure comes 1 s after the last, well within a 2 s window of it (room for a loaded
    # machine), but the last one 3 s after the first: the window stays open while they come.
    monkeypatch.setattr(tasks, "FAILURE_GRACE_S", 2.0)
    with pytest.raises(RankFailure) as info:
        spawn(fail_one_after_another, 1.0, world_size=4, timeout=GENEROUS_DEADLINE)
    assert set(info.value.failures) == {0, 1, 2, 3}
    assert "still running" not in str(info.value)


def test_raising_rank_is_reported_with_its_traceback_and_output_fast(spawn):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(raise_on_rank_1, timeout=GENEROUS_DEADLINE)
    elapsed = time.monotonic() - start
    assert set(info.value.failures) == {1}
    assert "ValueError: planted failure on rank 1" in info.value.failures[1]
    report = str(info.value)
    assert "[rank 1] rank 1 about to meet" in report
    assert "rank 0 was still running" in report and "barrier" in report
    assert not isinstance(info.value, RankTimeout)
    assert elapsed < GENEROUS_DEADLINE / 4, "rank 0 blocked in barrier must not be waited for"
    assert_pool_healthy(spawn)


def test_rank_calling_os_exit_is_reported_with_its_exit_code(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(exit_on_rank_1, timeout=GENEROUS_DEADLINE)
    assert "exited with code 7" in info.value.failures[1]
    assert_pool_healthy(spawn)


def test_sigkilled_rank_is_reported_with_its_signal(spawn):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(sigkill_rank_1, timeout=GENEROUS_DEADLINE)
    assert "killed by signal SIGKILL" in info.value.failures[1]
    assert time.monotonic() - start < GENEROUS_DEADLINE / 4
    assert_pool_healthy(spawn)


def test_one_sided_collective_is_reported_within_seconds_with_stack_and_per_test_count(spawn):
    spawn(traced_step)  # three collectives in an earlier test must not shift this test's count
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        spawn(progress_bar_barrier, timeout=GENEROUS_DEADLINE)
    assert time.monotonic() - start < 15, "rank 1 finished: rank 0's barrier can never complete"
    assert set(info.value.failures) == {0}, "only rank 0 is stuck"
    stuck = info.value.failures[0]
    assert "last collective entered: #1 barrier() at " in stuck
    assert "in progress_bar_barrier" in stuck, "the stack must show the test's frame"
    assert "Current thread" in stuck, "all threads are dumped"
    assert info.value.cause == 1, "rank 1 skipped the barrier"
    assert str(info.value).startswith(
        "rank(s) [1] finished without joining #1 barrier(), which rank(s) [0] are blocked in "
        "(a certain hang"
    )
    assert "--- rank 1 finished" in str(info.value)
    assert_pool_healthy(spawn)


def receives_from_any_source_on_both_sides():
    # Both ranks blocked, each waiting for a message the other never sends, from any source
    # (which the check cannot pair with a send): no rank finished, so only the deadline can
    # tell this from slow work.
    dist.recv(torch.zeros(1))


def test_two_sided_hang_is_a_timeout_at_the_deadline_with_every_stack(spawn):
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        spawn(receives_from_any_source_on_both_sides, timeout=3)
    assert time.monotonic() - start >= 3
    assert set(info.value.failures) == {0, 1}
    for rank in (0, 1):
        assert "last collective entered: #1 recv((1,):float32)" in info.value.failures[rank]
    assert "rank(s) [0, 1] did not finish within 3 s" in str(info.value)
    assert_pool_healthy(spawn)



def test_mismatched_collective_order_fails_naming_both_collectives(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(mismatched_order, timeout=GENEROUS_DEADLINE)
    report = str(info.value)
    assert "Detected mismatch between collectives" in report
    assert "rank 0 is running #1 all_reduce((4,):float32, SUM)" in report
    assert "rank 1 is running #1 broadcast((4,):float32, src=0)" in report
    assert set(info.value.failures) == {0, 1}, "every rank fails, none hangs"
    assert_pool_healthy(spawn)


def test_mismatched_shapes_fail_naming_the_shapes(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(mismatched_shapes, timeout=GENEROUS_DEADLINE)
    report = str(info.value)
    assert "Detected mismatch between collectives" in report
    assert "all_reduce((3,):float32, SUM)" in report and "all_reduce((4,):float32, SUM)" in report
    assert_pool_healthy(spawn)


def mismatched_reduce_ops():
    op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX
    dist.all_reduce(torch.ones(2), op=op)


def test_mismatched_reduce_ops_fail_instead_of_silently_disagreeing(spawn):
    # Same op type and shape: torch's own DETAIL fingerprint would let this through, and each
    # rank would compute a different "all-reduced" value.
    with pytest.raises(RankFailure) as info:
        spawn(mismatched_reduce_ops, timeout=GENEROUS_DEADLINE)
    assert "all_reduce((2,):float32, SUM)" in str(info.value)
    assert "all_reduce((2,):float32, MAX)" in str(info.value)
    assert_pool_healthy(spawn)


def same_calls_spelled_differently():
    # Each pair is one collective written two ways; defaults filled in, they must agree.
    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        dist.barrier()
    else:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.broadcast(t, src=0, group=dist.group.WORLD)
        dist.barrier(group=None)
    return t.tolist()


def test_equivalent_spellings_of_a_collective_are_not_a_mismatch(spawn):
    assert spawn(same_calls_spelled_differently) == [[2.0, 2.0]] * 2


def broadcast_from_self(object_list):
    # Each rank thinks it is the source: no hang and no error from torch, just divergence.
    if object_list:
        return dist.broadcast_object_list([dist.get_rank()], src=dist.get_rank())
    dist.broadcast(torch.ones(2), src=dist.get_rank())


@pytest.mark.parametrize("object_list", [False, True], ids=["broadcast", "object_list"])
def test_broadcast_from_different_sources_is_a_mismatch(spawn, object_list):
    with pytest.raises(RankFailure) as info:
        spawn(broadcast_from_self, object_list, timeout=GENEROUS_DEADLINE)
    report = str(info.value)
    assert "Detected mismatch between collectives" in report
    assert "src=0)" in report and "src=1)" in report
    assert_pool_healthy(spawn)


def subgroup_collectives():
    # Collectives on a subgroup only involve its members: they must not be fingerprinted
    # against the whole world (that would hang the non-members' check).
    evens = dist.new_group([0, 2])
    t = torch.ones(1)
    if dist.get_rank() in (0, 2):
        dist.all_reduce(t, group=evens)
    dist.barrier()
    return t.item()


def test_subgroup_collectives_run_under_fingerprint_checking(spawn):
    assert spawn(subgroup_collectives, world_size=3) == [2.0, 1.0, 2.0]


def test_rank_killed_between_tests_is_replaced_and_the_next_task_runs(spawn):
    before = {pid for _, _, pid in spawn(whoami)}
    pool = _pools[PoolKey(2)]
    os.kill(pool.procs[1].pid, signal.SIGKILL)  # the OOM killer, between two tests
    pool.procs[1].wait()
    after = {pid for _, _, pid in spawn(whoami)}
    assert before.isdisjoint(after), "the broken pool must be replaced, not reused"
    assert_pool_healthy(spawn)


def test_rank_dying_as_the_task_is_sent_is_retried_on_a_fresh_pool(spawn, monkeypatch):
    spawn(whoami)
    pool = _pools[PoolKey(2)]
    os.kill(pool.procs[1].pid, signal.SIGKILL)
    os.waitid(os.P_PID, pool.procs[1].pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
    monkeypatch.setattr(type(pool), "alive", lambda self: True)  # the check just missed it
    assert [r[:2] for r in spawn(whoami)] == [(0, 2), (1, 2)]


def test_unsound_pool_is_recycled_after_a_task(spawn):
    before = {pid for _, _, pid in spawn(whoami)}
    spawn(destroy_group)
    after = {pid for _, _, pid in spawn(whoami)}
    assert before.isdisjoint(after), "a pool whose group was destroyed must be replaced"


class DriverInterrupted(Exception):
    """What a driver-side deadline raises (pytest-timeout's failure, a notebook's timer)."""


def rank_1_late_then_barrier(late_s, value):
    if dist.get_rank() == 1:
        time.sleep(late_s)
    dist.barrier()
    return value


@pytest.mark.parametrize("interruption", [DriverInterrupted, KeyboardInterrupt])
def test_a_task_interrupted_in_the_driver_stops_its_pool_not_the_next_task(
    spawn, capfd, interruption
):
    # Interrupted while the ranks still run the task, a warm pool kept running it, and the
    # next task on it got this one's results (issue found from a user's project).
    def interrupt(signum, frame):
        raise interruption("the driver's own deadline")

    spawn(whoami)  # the pool warm: the interruption comes while the ranks run the task
    previous = signal.signal(signal.SIGUSR2, interrupt)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    try:
        with pytest.raises(interruption):
            spawn(rank_1_late_then_barrier, 6.0, "old", timeout=GENEROUS_DEADLINE)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR2, previous)
    stderr = capfd.readouterr().err
    assert spawn(rank_1_late_then_barrier, 0.0, "new") == ["new", "new"]
    if interruption is DriverInterrupted:  # every rank's stack, which the deadline's report lacks
        assert "interrupted (DriverInterrupted: the driver's own deadline)" in stderr
        assert "rank 1 was still running" in stderr and "in rank_1_late_then_barrier" in stderr
        assert "#1 barrier()" in stderr  # rank 0, waiting for rank 1
    else:  # Ctrl-C: out at once
        assert "interrupted" not in stderr


def test_lambdas_closures_and_nested_functions_run_on_the_ranks(spawn):
    offset = 10

    def nested(scale):  # captures `offset` from the test
        return dist.get_rank() * scale + offset

    assert spawn(lambda: dist.get_rank()) == [0, 1]
    assert spawn(nested, 3) == [10, 13]
    assert spawn(lambda t: rank_sum(t) + offset, 1) == [13.0, 13.0]


def test_what_cannot_be_sent_is_a_one_line_error_naming_it(spawn):
    import threading

    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^cannot send test_what_cannot_be_sent_is_a_one_line_"
                       r"error_naming_it.<locals>.<lambda> to the ranks: cannot pickle "
                       r"'_thread.lock' object$"):  # fmt: skip
        spawn(lambda: lock.locked())
    with pytest.raises(TypeError, match="^cannot send argument 'guard' of rank_sum to the ranks"):
        spawn(rank_sum, 1, guard=lock)


def test_a_lambda_without_cloudpickle_is_a_one_line_error_saying_to_install_it(spawn, monkeypatch):
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # import cloudpickle -> ImportError
    with pytest.raises(TypeError, match=r"needs cloudpickle: pip install cloudpickle"):
        spawn(lambda: 1)
    assert spawn(whoami)[0][:2] == (0, 2), "module-level functions need no cloudpickle"


def test_collectives_are_recorded_with_their_signature(spawn):
    logs = spawn(traced_step)
    assert (
        logs[0]
        == logs[1]
        == ["all_reduce((2, 3):float32, MAX)", "broadcast((5,):int64, src=0)", "barrier()"]
    )


def test_ranks_run_with_fingerprint_checking_by_default(spawn):
    assert spawn(env_var, "TORCH_DISTRIBUTED_DEBUG") == ["DETAIL", "DETAIL"]


@pytest.mark.world_size(1, 3)
def test_world_size_marker_sets_the_spawn_default(spawn, _refddp_world_size):
    results = spawn(whoami)
    assert [r[1] for r in results] == [_refddp_world_size] * _refddp_world_size


def test_pools_are_keyed_by_world_size(spawn):
    spawn(whoami, world_size=2)
    spawn(whoami, world_size=3)
    assert {(2, "gloo"), (3, "gloo")} <= {key[:2] for key in _pools}


OUTSIDE_PYTEST = """
import sys
from refddp.testing import RankSkipped, spawn_ranks
from refddp.testing.driver.pool import RankPool


def skip_here():
    import pytest

    pytest.skip("not on this rank")


def loading_flag():
    import os

    return os.environ.get("REFDDP_LOADING_DRIVER_MODULES")


if __name__ == "__main__":
    try:
        spawn_ranks(skip_here)
    except RankSkipped as skip:
        print("skipped:", skip.reason)
    print("flag after the load:", spawn_ranks(loading_flag))
    print("driver imported pytest:", any(m.split(".")[0] in ("pytest", "_pytest") for m in sys.modules))
    pool = RankPool(2)
    ranks = pool.procs
    pool.close()
    print("ranks exited with:", [rank.returncode for rank in ranks])
"""


def test_driver_needs_no_pytest_and_stops_ranks_with_a_stop_message(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(OUTSIDE_PYTEST)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=True
    ).stdout
    assert "skipped: not on this rank" in out, "a rank's skip is a RankSkipped outside pytest"
    assert "driver imported pytest: False" in out
    assert "flag after the load: [None, None]" in out, "a load's flag must not outlive it"
    assert "ranks exited with: [0, 0]" in out, "Stop, not SIGKILL, ends an idle pool"


# A stop for the sake of the tests of a pool started at import: without the harness's refusal,
# each rank's load of the module starts a pool of its own, whose ranks load it again; here the
# third level fails.
STOP_NESTED_POOLS = """
import os

depth = int(os.environ.get("NESTED_POOLS", "0"))
if depth >= 2:
    raise SystemExit("nested pools two deep")
os.environ["NESTED_POOLS"] = str(depth + 1)
"""

NO_MAIN_GUARD = STOP_NESTED_POOLS + """
from refddp.testing import RankFailure, spawn_ranks


def one():
    return 1


try:
    print("results:", spawn_ranks(one, world_size=2))
except RankFailure as failure:
    print("refused:", "under `if __name__" in str(failure))
"""


def test_a_driver_script_without_a_main_guard_is_refused_in_the_ranks_not_run_again(tmp_path):
    # Each rank loads the driver's script to find ``one``: its top-level spawn_ranks would
    # start a pool in every rank, and theirs in every one of theirs.
    script = tmp_path / "driver.py"
    script.write_text(NO_MAIN_GUARD)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240
    ).stdout
    assert "refused: True" in out, out


def test_rank_whose_driver_died_before_it_started_exits_at_once(tmp_path):
    ours, theirs = socket.socketpair()
    with ours, theirs:
        rank = subprocess.run(
            [sys.executable, "-m", "refddp.testing.rank.worker", "--fd", str(theirs.fileno())]
            + ["--rank", "0", "--world-size", "2", "--backend", "gloo", "--store-port", "9"]
            + ["--workdir", str(tmp_path), "--driver-pid", str(2**22 + 1)],  # never its parent
            pass_fds=(theirs.fileno(),),
            timeout=60,
        )
    assert rank.returncode == 3, "an orphan must not wait for a store nobody serves"
