"""Who skipped a collective, from the ranks' slots: the finished ranks the collective needs,
less the ones that took part and got out (``reports.finished_without_joining``)."""

from refddp.testing.driver.reports import blocked_for_good, finished_without_joining
from refddp.testing.slots import SlotReading


def slot(last: str, inside: bool = False, members: frozenset[int] | None = None,
         on_world: bool = True) -> SlotReading:  # fmt: skip
    entered = int(last.split(" ", 1)[0].lstrip("#")) if last else 0
    return SlotReading(last, inside, on_world, members, entered)


def test_a_world_collective_blames_every_finished_rank_that_did_not_reach_it():
    slots = {
        0: slot(""),  # finished before any collective
        1: slot("#1 all_reduce((4,):float32, SUM) at t.py:3 in f", inside=True),
        2: slot(""),
        3: slot("#1 all_reduce((4,):float32, SUM) at t.py:3 in f", inside=True),
    }
    assert finished_without_joining([1, 3], {0, 2}, slots) == [0, 2]


def test_a_rank_that_went_through_the_collective_is_not_blamed():
    # Without a fingerprint check a broadcast's receiver gets its data and finishes while the
    # ranks downstream of the skipping one still wait.
    entered = slot("#2 broadcast((4,):float32, src=3) at t.py:9 in f")
    waiting = slot("#2 broadcast((4,):float32, src=3) at t.py:9 in f", inside=True)
    slots = {0: slot("#1 barrier() at t.py:2 in f"), 1: entered, 2: waiting, 3: waiting}
    assert finished_without_joining([2, 3], {0, 1}, slots) == [0]


def test_a_finished_rank_outside_the_subgroup_is_not_blamed():
    group = frozenset({0, 1, 2})
    waiting = slot("#1 all_reduce((4,):float32, SUM, group=[0, 1, 2]) at t.py:3 in f",
                   inside=True, members=group, on_world=False)  # fmt: skip
    slots = {0: waiting, 1: slot(""), 2: waiting, 3: slot("")}
    assert finished_without_joining([0, 2], {1, 3}, slots) == [1]


def test_a_receive_blames_its_peer_only():
    waiting = slot("#1 recv((1,):float32, src=2) at t.py:5 in f", inside=True,
                   members=frozenset({2}), on_world=False)  # fmt: skip
    slots = {0: waiting, 1: slot(""), 2: slot("")}
    assert finished_without_joining([0], {1, 2}, slots) == [2]


def test_unknown_members_or_incomparable_counts_name_every_finished_candidate():
    unregistered = slot("#1 all_reduce((4,):float32, SUM, group=unregistered(3)) at t.py:3 in f",
                        inside=True, on_world=False)  # fmt: skip
    slots = {0: unregistered, 1: slot(""), 2: slot("")}
    assert finished_without_joining([0], {1, 2}, slots) == [1, 2]
    # Both finished ranks count more collectives than the waiting one (subgroup collectives
    # in between): counts say nothing, so both are named rather than none.
    later = slot("#7 barrier() at t.py:8 in f")
    waiting = slot("#3 all_reduce((4,):float32, SUM) at t.py:3 in f", inside=True)
    assert finished_without_joining([0], {1, 2}, {0: waiting, 1: later, 2: later}) == [1, 2]


GATHER = "#1 gather((2,):float32, dst=0, group=[0, 1, 2]) at t.py:4 in f"


def test_a_root_waiting_for_a_member_still_on_its_way_is_not_blocked_for_good():
    group = frozenset({0, 1, 2})
    root = slot(GATHER, inside=True, members=group, on_world=False)
    late = slot("", inside=False)  # rank 2: computing, not yet in the gather
    slots = {0: root, 2: late}
    assert blocked_for_good([0, 2], slots, 4) == []  # rank 1 sent its part and finished
    # Rank 2 waits elsewhere, on rank 3 who is still on its way: it can still come.
    elsewhere = slot("#1 all_reduce((4,):float32, SUM, group=[2, 3]) at t.py:9 in f",
                     inside=True, members=frozenset({2, 3}), on_world=False)  # fmt: skip
    slots = {0: root, 2: elsewhere, 3: slot("")}
    assert blocked_for_good([0, 2, 3], slots, 4) == []
    # Rank 3 finished instead: rank 2 can never leave its all-reduce, nor rank 0 its gather.
    assert blocked_for_good([0, 2], {0: root, 2: elsewhere}, 4) == [0, 2]


def test_ranks_waiting_only_on_finished_ranks_are_blocked_for_good():
    world = slot("#2 all_reduce((4,):float32, SUM) at t.py:3 in f", inside=True)
    unknown = slot("#2 all_reduce((4,):float32, SUM, group=unregistered(2)) at t.py:3 in f",
                   inside=True, on_world=False)  # fmt: skip
    assert blocked_for_good([1, 3], {1: world, 3: world}, 4) == [1, 3]
    assert blocked_for_good([1, 3], {1: world, 3: unknown}, 4) == [], "unknown: may progress"
    assert blocked_for_good([3], {3: unknown}, 4) == [3], "alone: certain"
