"""Collectives called on a process-group object (``pg.broadcast(...)``, PyTorch's own tests'
style, on the default group's object, a ``new_group`` or a ``ProcessGroupGloo`` built directly)
are traced as ``torch.distributed``'s functions are: recorded once each (a function that calls
the group's method itself is one collective), named in reports while a rank is blocked in one,
a rank that skips one named in seconds, counted by faults at collective k, and checked against
the other ranks' calls of the function they stand for."""

import time

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure, RankTimeout, faults, record_collectives
from refddp.testing.checks import collectives

DEADLINE = 30.0  # every failure below is reported long before this


def group_broadcast_skipped_by_rank_1(checked):
    if not checked:  # as under --no-dist-debug (the pool is replaced after this task fails)
        collectives._checker = None
    pg = dist.distributed_c10d._get_default_group()  # how PyTorch's tests get it
    if dist.get_rank() == 0:
        pg.broadcast([torch.ones(4)], dist.BroadcastOptions()).wait()  # rank 1 never joins
    return "done"


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_a_rank_skipping_a_groups_broadcast_is_named_in_seconds(spawn, checked):
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        spawn(group_broadcast_skipped_by_rank_1, checked, timeout=DEADLINE)
    assert time.monotonic() - start < 15
    assert info.value.cause == 1
    assert str(info.value).startswith(
        "rank(s) [1] finished without joining #1 broadcast((4,):float32, src=0)"
    ), str(info.value).splitlines()[0]
    assert "last collective entered: #1 broadcast((4,):float32, src=0)" in info.value.failures[0]


def group_built_from_the_backend_class(path):
    store = dist.FileStore(path, 2)
    pg = dist.ProcessGroupGloo(store, dist.get_rank(), 2)
    t = torch.ones(2) * (dist.get_rank() + 1)
    pg.allreduce([t]).wait()
    if dist.get_rank() == 0:
        pg.barrier().wait()  # rank 1 never joins
    return t.tolist()


def test_a_group_built_from_the_backend_class_is_traced_and_its_skipped_barrier_named(spawn,
                                                                                     tmp_path):  # fmt: skip
    with pytest.raises(RankTimeout) as info:
        spawn(group_built_from_the_backend_class, str(tmp_path / "store"), timeout=DEADLINE)
    assert info.value.cause == 1
    assert str(info.value).startswith(
        "rank(s) [1] finished without joining #2 barrier(group=unregistered(2))"
    ), str(info.value).splitlines()[0]


def mixed_calls():
    pg, t = dist.group.WORLD, torch.ones(2)
    pg.allreduce([t]).wait()  # #1
    dist.all_reduce(t)  # #2
    pg.barrier().wait()  # #3: rank 1 is killed here
    return t.tolist()


def test_a_fault_at_collective_k_counts_a_groups_method_calls(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(mixed_calls, faults=[faults.kill(1, at=3)], timeout=DEADLINE)
    assert str(info.value).startswith(
        "rank 1 failed first: killed by signal SIGKILL (injected: kill rank 1 at collective #3 "
        "barrier())"
    ), str(info.value).splitlines()[0]


def every_kind_once():
    rank, pg = dist.get_rank(), dist.group.WORLD
    peer = 1 - rank
    with record_collectives() as log:
        dist.all_reduce(torch.ones(2))
        pg.allreduce([torch.ones(2)]).wait()
        dist.all_gather_object([None, None], rank)  # (it calls all_gather inside)
        dist.broadcast_object_list([rank], src=0)  # (two broadcasts inside)
        if rank == 0:
            dist.send(torch.ones(2), dst=1)  # (isend and wait inside)
        else:
            dist.recv(torch.zeros(2), src=0)
        got = torch.zeros(1)
        ops = [dist.P2POp(dist.isend, torch.full((1,), float(rank)), peer),
               dist.P2POp(dist.irecv, got, peer)]  # fmt: skip
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        dist.all_to_all_single(torch.zeros(2), torch.ones(2))
    return log, got.item()


def test_each_collective_is_recorded_once_whether_called_as_a_function_or_a_method(spawn):
    (log0, got0), (log1, got1) = spawn(every_kind_once)
    assert (got0, got1) == (1.0, 0.0), "batch_isend_irecv takes torch.distributed's isend"
    common = ["all_reduce((2,):float32, SUM)", "all_reduce((2,):float32, SUM)",
              "all_gather_object()", "broadcast_object_list(1 object(s), src=0)"]  # fmt: skip
    last = "all_to_all_single((2,):float32, (2,):float32)"
    assert log0 == [*common, "send((2,):float32, dst=1)",
                    "batch_isend_irecv(isend((1,):float32, dst=1), irecv((1,):float32, src=1))",
                    last]  # fmt: skip
    assert log1 == [*common, "recv((2,):float32, src=0)",
                    "batch_isend_irecv(isend((1,):float32, dst=0), irecv((1,):float32, src=0))",
                    last]  # fmt: skip


def method_against_function(op_on_rank_0):
    t = torch.ones(2) * (dist.get_rank() + 1)
    if dist.get_rank() == 0:
        opts = dist.AllreduceOptions()
        opts.reduceOp = getattr(dist.ReduceOp, op_on_rank_0)
        dist.group.WORLD.allreduce([t], opts).wait()
    else:
        dist.all_reduce(t)
    return t.tolist()


def test_a_groups_method_and_the_function_it_stands_for_agree_and_disagree_as_the_function(spawn):
    assert spawn(method_against_function, "SUM") == [[3.0, 3.0]] * 2
    with pytest.raises(RankFailure) as info:
        spawn(method_against_function, "MAX", timeout=DEADLINE)
    assert (
        "rank 0 is running #1 all_reduce((2,):float32, MAX); rank 1 is running #1 "
        "all_reduce((2,):float32, SUM)"
    ) in str(info.value)


def broadcast_on_a_subgroup_by_method_and_function():
    # The group [1, 2]: its rank 0 is global rank 1. The method takes the group's rank, the
    # function the global one: the same root.
    pair = dist.new_group([1, 2])
    t = torch.full((2,), float(dist.get_rank()))
    if dist.get_rank() == 1:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        pair.broadcast([t], opts).wait()
    elif dist.get_rank() == 2:
        dist.broadcast(t, src=1, group=pair)
    return t.tolist()


def test_a_groups_root_is_read_as_a_global_rank_on_a_subgroup(spawn):
    assert spawn(broadcast_on_a_subgroup_by_method_and_function, world_size=3) == \
        [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]  # fmt: skip


def bare_group_in_another_dtype(path):
    pg = dist.ProcessGroupGloo(dist.FileStore(path, 2), dist.get_rank(), 2)
    dtype = torch.float32 if dist.get_rank() == 0 else torch.int32
    pg.allreduce([torch.ones(2, dtype=dtype)]).wait()


def test_a_group_built_from_the_backend_class_with_every_rank_is_checked(spawn, tmp_path):
    with pytest.raises(RankFailure) as info:
        spawn(bare_group_in_another_dtype, str(tmp_path / "store"), timeout=DEADLINE)
    assert (
        "rank 0 is running #1 all_reduce((2,):float32, SUM, group=unregistered(2)); rank 1 is "
        "running #1 all_reduce((2,):int32, SUM, group=unregistered(2))"
    ) in str(info.value)
