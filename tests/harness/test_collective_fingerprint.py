"""The harness's collective check names what differs, on every kind of group, before torch
sees mismatched buffers: dtypes (the issue's all_gather of float32 against int32, whose bytes
gloo would reinterpret), all_to_all's split sizes that do not pair up, a send and its receive,
a subgroup's members, a rank on another group than its peers, two groups over the same ranks
(told apart by the numbers torch gave them) and a receive whose sender sends another tag; and
lets through what torch allows (broadcast's shape at an equal element count, groups over the
same ranks used alike, tagged messages received in another order, a sender still finishing a
collective, a slow send an irecv will take). Shapes, order and reduce ops on the default
group: test_harness.py; the whole space of calls: test_collective_space.py."""

import time

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure

DEADLINE = 30.0  # every mismatch below is reported long before this


def mismatched_dtypes():
    dtype = torch.float32 if dist.get_rank() == 0 else torch.float64
    dist.all_reduce(torch.ones(2, dtype=dtype))


def test_mismatched_dtypes_fail_naming_both_dtypes(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(mismatched_dtypes, timeout=60)
    report = str(info.value)
    assert "Detected mismatch between collectives" in report
    assert "all_reduce((2,):float32, SUM)" in report and "all_reduce((2,):float64, SUM)" in report


def all_gather_float_against_int():
    # The issue: gloo completes it, each rank reading the other's bytes as its own dtype
    # (1.4e-45 and 1065353216).
    dtype = torch.float32 if dist.get_rank() == 0 else torch.int32
    out = [torch.zeros(2, dtype=dtype) for _ in range(2)]
    dist.all_gather(out, torch.ones(2, dtype=dtype))
    return [t.tolist() for t in out]


def test_the_issues_all_gather_of_float32_against_int32_fails_naming_both_ranks_and_dtypes(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(all_gather_float_against_int, timeout=DEADLINE)
    assert set(info.value.failures) == {0, 1}, "both ranks fail, before gloo mixes the bytes"
    assert (
        "Detected mismatch between collectives on ranks: rank 0 is running #1 "
        "all_gather([2x(2,):float32], (2,):float32); rank 1 is running #1 "
        "all_gather([2x(2,):int32], (2,):int32)"
    ) in str(info.value)


def own_part_in_another_dtype():
    # Every rank passes the same list; rank 1's own part is not of its dtype.
    own = torch.ones(2, dtype=torch.int32 if dist.get_rank() == 1 else torch.float32)
    dist.all_gather([torch.zeros(2) for _ in range(2)], own)


def test_a_ranks_own_part_in_another_dtype_is_a_mismatch_on_every_rank(spawn):
    # Without the check, rank 1's gloo refuses it and rank 0 waits in the gather for good.
    with pytest.raises(RankFailure) as info:
        spawn(own_part_in_another_dtype, timeout=DEADLINE)
    assert set(info.value.failures) == {0, 1}
    assert "rank 1 is running #1 all_gather([2x(2,):float32], (2,):int32)" in str(info.value)


def broadcast_in_another_shape():
    t = torch.arange(6.0).reshape(2, 3) if dist.get_rank() == 0 else torch.zeros(6)
    dist.broadcast(t, src=0)
    return t.flatten().tolist()


def test_a_broadcast_of_the_same_element_count_in_another_shape_passes(spawn):
    assert spawn(broadcast_in_another_shape) == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]] * 2


def unpaired_splits():
    # Rank 0 sends rank 1 two rows; rank 1 expects one from it (and sends rank 0 one more
    # than rank 0 expects): gloo would wait for good, or fill the rest with what is left.
    out, inp = torch.zeros(3, 2), torch.ones(3, 2)
    dist.all_to_all_single(out, inp, [1, 2], [1, 2])


def test_all_to_all_split_sizes_that_do_not_pair_up_fail_naming_the_pair(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(unpaired_splits, timeout=DEADLINE)
    assert set(info.value.failures) == {0, 1}
    assert "rank 0 sends 2 to rank 1, which expects 1" in str(info.value)


def paired_uneven_splits():
    rank = dist.get_rank()
    sends, receives = ([1, 2], [1, 3]) if rank == 0 else ([3, 1], [2, 1])
    out = torch.zeros(sum(receives))
    dist.all_to_all_single(out, torch.full((sum(sends),), float(rank)), receives, sends)
    return out.tolist()


def test_uneven_split_sizes_that_pair_up_pass(spawn):
    assert spawn(paired_uneven_splits) == [[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]


def send_float_receive_int():
    if dist.get_rank() == 0:
        dist.send(torch.ones(2), dst=1)
    else:
        t = torch.zeros(2, dtype=torch.int32)
        dist.recv(t, src=0)  # gloo would fill it with 1065353216s
        return t.tolist()


def test_a_receive_of_another_dtype_than_its_send_fails_naming_both(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(send_float_receive_int, timeout=DEADLINE)
    assert (
        "Detected mismatch between collectives on ranks: rank 0 is running #1 send((2,):float32, "
        "dst=1); rank 1 is running #1 recv((2,):int32, src=0)"
    ) in str(info.value)


def subgroup_members_disagree():
    evens = dist.new_group([0, 2])
    if dist.get_rank() in (0, 2):
        dtype = torch.float32 if dist.get_rank() == 0 else torch.int32
        dist.all_reduce(torch.ones(2, dtype=dtype), group=evens)
    return "done"


def test_a_subgroups_members_that_disagree_fail_and_the_others_finish(spawn):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(subgroup_members_disagree, world_size=3, timeout=DEADLINE)
    assert time.monotonic() - start < 15
    assert set(info.value.failures) == {0, 2}, "rank 1, outside the group, finishes"
    assert (
        "rank 0 is running #1 all_reduce((2,):float32, SUM, group=[0, 2]); rank 2 is running #1 "
        "all_reduce((2,):int32, SUM, group=[0, 2])"
    ) in str(info.value)


def one_rank_on_a_subgroup():
    pair = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2), group=pair if dist.get_rank() == 0 else None)


def test_a_rank_on_a_subgroup_while_its_peers_are_on_the_world_is_named_in_seconds(spawn):
    # Rank 0 waits for rank 1 in the pair's check; ranks 1 and 2 wait for rank 0 in the world's:
    # neither can ever end. Rank 0 sees rank 1 blocked in a collective that needs it.
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(one_rank_on_a_subgroup, world_size=3, timeout=DEADLINE)
    assert time.monotonic() - start < 15
    assert (
        "Detected mismatch between collectives on ranks: rank 0 is running #1 all_reduce((2,):"
        "float32, SUM, group=[0, 1]); rank 1 is running #1 all_reduce((2,):float32, SUM)"
    ) in str(info.value)


def world_against_a_group_of_every_rank():
    every = dist.new_group()  # the same ranks, another group: torch would hang
    dist.all_reduce(torch.ones(2), group=every if dist.get_rank() == 1 else None)


def test_the_default_group_and_another_group_of_every_rank_are_told_apart(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(world_against_a_group_of_every_rank, timeout=DEADLINE)
    assert (
        "rank 0 is running #1 all_reduce((2,):float32, SUM); rank 1 is running #1 "
        "all_reduce((2,):float32, SUM, group=[0, 1])"
    ) in str(info.value)


def ddp_on_a_new_group():
    group = dist.new_group()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), process_group=group)
    model(torch.ones(1, 2)).sum().backward()
    return model.module.weight.grad.tolist()


def test_ddp_on_a_group_the_test_makes_runs_checked_by_the_harness_not_torchs_wrapper(spawn):
    # Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps new groups in its ProcessGroupWrapper, on
    # which DDP's construction crashed gloo ranks (SIGSEGV): the harness's check replaces it.
    grads = spawn(ddp_on_a_new_group, timeout=DEADLINE)
    assert grads[0] == grads[1] == [[1.0, 1.0], [1.0, 1.0]]


def two_groups_over_the_same_ranks(world_size_ranks):
    # Two new_group calls over the same ranks make two communicators: torch would hang, each
    # rank waiting on the other in its own group. The descriptions look alike; the names differ.
    first, second = dist.new_group(world_size_ranks), dist.new_group(world_size_ranks)
    if dist.get_rank() in world_size_ranks:
        group = first if dist.get_rank() == world_size_ranks[0] else second
        dist.all_reduce(torch.ones(2), group=group)
    return "done"


@pytest.mark.parametrize("world_size, ranks", [(2, [0, 1]), (3, [0, 2])],
                         ids=["groups-of-every-rank", "subgroups"])  # fmt: skip
def test_two_groups_over_the_same_ranks_are_told_apart_by_their_names_in_seconds(
    spawn, world_size, ranks
):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(two_groups_over_the_same_ranks, ranks, world_size=world_size, timeout=DEADLINE)
    assert time.monotonic() - start < 15, "named by the check, not by the deadline"
    # (On a subgroup the first member to see the other blocked raises; the other may then
    # be left waiting for it, and is reported so.)
    assert info.value.failures and set(info.value.failures) <= set(ranks), info.value.failures
    call = f"all_reduce((2,):float32, SUM, group={ranks})"
    report = str(info.value)
    assert "Detected mismatch between collectives" in report, report
    assert f"#1 {call} on group '" in report
    assert "two different groups over the same ranks" in report
    named = {part.split("on group '")[1].split("'")[0] for part in report.split(";")[:2]}
    assert len(named) == 2, report


def two_groups_over_the_same_ranks_alike(ranks):
    first, second = dist.new_group(ranks), dist.new_group(ranks)
    out = []
    if dist.get_rank() in ranks:
        for group in (first, second, first):
            t = torch.ones(2)
            dist.all_reduce(t, group=group)
            out.append(t.tolist())
    # No barrier: the harness frees the groups after the task's reply, so a gloo thread still
    # releasing the last all-reduce does not deadlock the rank (torch 2.5: leftovers.py).
    return out


@pytest.mark.parametrize("world_size, ranks", [(2, [0, 1]), (3, [0, 2])],
                         ids=["groups-of-every-rank", "subgroups"])  # fmt: skip
def test_two_groups_over_the_same_ranks_used_alike_pass(spawn, world_size, ranks):
    results = spawn(two_groups_over_the_same_ranks_alike, ranks, world_size=world_size,
                    timeout=DEADLINE)  # fmt: skip
    assert [results[r] for r in ranks] == [[[2.0, 2.0]] * 3] * 2


def send_and_receive_of_other_tags():
    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.send(t, dst=1, tag=1)
    else:
        dist.recv(t, src=0, tag=2)  # gloo: each waits for the other for good


def other_tags_beside_an_unwaited_all_reduce():
    # An async all-reduce in flight on both ranks answers neither the send nor the receive.
    work = dist.all_reduce(torch.ones(1), async_op=True)
    send_and_receive_of_other_tags()
    work.wait()


def barrier_against_recv():
    # Rank 1 waits to receive from rank 0, which waits in a barrier for rank 1.
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        dist.recv(torch.zeros(2), src=0)


@pytest.mark.parametrize("task, sender_runs, number", [
    (send_and_receive_of_other_tags, "send((2,):float32, dst=1, tag=1)", 1),
    (other_tags_beside_an_unwaited_all_reduce, "send((2,):float32, dst=1, tag=1)", 2),
    (barrier_against_recv, "barrier()", 1),
], ids=["a-send-of-another-tag", "beside-an-async-collective", "a-collective"])  # fmt: skip
def test_a_receive_whose_sender_cannot_post_is_named_in_seconds(spawn, task, sender_runs,
                                                                 number):  # fmt: skip
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(task, timeout=DEADLINE)
    assert time.monotonic() - start < 15, "named by the check, not by the deadline"
    receives = "recv((2,):float32, src=0" + (", tag=2)" if "tag" in sender_runs else ")")
    assert (
        f"Detected mismatch between collectives on ranks: rank 0 is running #{number} "
        f"{sender_runs}; rank 1 is running #{number} {receives}"
    ) in str(info.value)


def send_and_receive_on_two_groups_over_the_same_ranks():
    first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.send(t, dst=1, group=first)
    elif dist.get_rank() == 1:
        dist.recv(t, src=0, group=second)


def test_a_send_and_its_receive_on_two_groups_over_the_same_ranks_are_named_in_seconds(spawn):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(send_and_receive_on_two_groups_over_the_same_ranks, world_size=3, timeout=DEADLINE)
    assert time.monotonic() - start < 15, "named by the check, not by the deadline"
    report = str(info.value)
    assert "rank 0 is running #1 send((2,):float32, dst=1, group=[0, 1]) on group '" in report
    assert "rank 1 is running #1 recv((2,):float32, src=0, group=[0, 1]) on group '" in report
    assert "two different groups over the same ranks" in report


def tagged_messages_received_in_another_order():
    # Legal: each isend is received by the receive of its tag, whatever the order.
    if dist.get_rank() == 0:
        works = [dist.isend(torch.full((2,), float(tag)), dst=1, tag=tag) for tag in (1, 2)]
        for work in works:
            work.wait()
        return []
    second, first = torch.zeros(2), torch.zeros(2)
    dist.recv(second, src=0, tag=2)
    dist.recv(first, src=0, tag=1)
    return [first.tolist(), second.tolist()]


def test_tagged_messages_received_in_another_order_than_sent_pass(spawn):
    assert spawn(tagged_messages_received_in_another_order, timeout=DEADLINE)[1] == [
        [1.0, 1.0], [2.0, 2.0]
    ]


def blocking_send_received_by_an_earlier_irecv(any_source=False):
    # Legal: rank 0 blocks in the send of tag 1 while rank 1 waits for tag 2; rank 1's irecv of
    # tag 1 (from rank 0, or from any source), posted before, takes it, and rank 0 goes on to
    # send tag 2.
    if dist.get_rank() == 0:
        dist.send(torch.full((2,), 1.0), dst=1, tag=1)
        dist.send(torch.full((2,), 2.0), dst=1, tag=2)
        return []
    first, second = torch.zeros(2), torch.zeros(2)
    work = dist.irecv(first, tag=1) if any_source else dist.irecv(first, src=0, tag=1)
    dist.recv(second, src=0, tag=2)
    work.wait()
    return [first.tolist(), second.tolist()]


def test_a_blocking_send_taken_by_an_irecv_posted_before_passes(spawn):
    assert spawn(blocking_send_received_by_an_earlier_irecv, timeout=DEADLINE)[1] == [
        [1.0, 1.0], [2.0, 2.0]
    ]


def _slowly_restored(seconds):
    if dist.get_rank() == 1:
        time.sleep(seconds)  # unpickled on rank 1 only: it finishes the broadcast late
    return "object"


class SlowToUnpickle:
    def __reduce__(self):
        return _slowly_restored, (2.5,)


def receive_after_a_broadcast_its_sender_finishes_late():
    # Legal: rank 0 leaves the broadcast at once and waits to receive from rank 1, which is
    # still unpickling the object for 2.5 s (longer than the check's wait before it names a
    # peer): rank 1 is in a call rank 0 has been in, finishing it, not waiting for rank 0.
    objects = [SlowToUnpickle() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(objects, src=0)
    t = torch.full((2,), float(dist.get_rank()))
    if dist.get_rank() == 0:
        dist.recv(t, src=1)
    else:
        dist.send(t, dst=0)
    return t.tolist()


def test_a_receive_whose_sender_is_still_finishing_a_collective_it_left_passes(spawn):
    assert spawn(receive_after_a_broadcast_its_sender_finishes_late, timeout=DEADLINE) == [
        [1.0, 1.0], [1.0, 1.0]
    ]


def test_ranks_waiting_for_good_on_one_another_are_named_with_their_groups_unchecked():
    # Without the check (debug=False) the driver names the hang: no finished rank is among
    # those the two calls need, each waits for the other in its own group.
    from refddp.testing import RankTimeout
    from refddp.testing.driver.warm_pools import spawn_ranks

    with pytest.raises(RankTimeout) as info:
        spawn_ranks(two_groups_over_the_same_ranks, [0, 2], world_size=3, timeout=DEADLINE,
                    debug=False)  # fmt: skip
    headline = str(info.value).splitlines()[0]
    assert "rank(s) [0, 2] wait for good on one another: rank 0 in #1 all_reduce(" in headline
    assert "a certain hang" in headline and "on group '" in headline, headline


@pytest.mark.parametrize("any_source", [False, True], ids=["from-the-sender", "from-any-source"])
def test_a_slow_send_that_an_irecv_in_flight_takes_passes(spawn, any_source):
    # Legal: rank 0's send of tag 1 takes 2.5 s (a large tensor on a slow link, injected as a
    # delay in the send) while rank 1, its irecv of tag 1 in flight, waits for tag 2: the irecv
    # will take that send, so it is no hang, however long the send takes.
    from refddp.testing import faults

    results = spawn(blocking_send_received_by_an_earlier_irecv, any_source, timeout=DEADLINE,
                    faults=[faults.delay(0, 1, 2.5)])  # fmt: skip
    assert results[1] == [[1.0, 1.0], [2.0, 2.0]]
