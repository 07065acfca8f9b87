"""Rank lists and reports that stay readable at a thousand ranks (refddp/testing/rank_lists.py,
reports.py)."""

import os

from hypothesis import given
from hypothesis import strategies as st

from refddp.testing.driver.reports import FULL_SECTIONS, SHOWN_IN_FULL, PoolFiles
from refddp.testing.rank_lists import group_rank_lines, parse_rank_list, rank_list, who


def test_runs_of_ranks_are_written_as_ranges():
    assert rank_list([0, 1, 3]) == "[0, 1, 3]"
    assert rank_list(range(1024)) == "[0-1023]"
    assert rank_list([r for r in range(1024) if r != 17]) == "[0-16, 18-1023]"
    assert who([5]) == "rank 5" and who(list(range(1023))) == "ranks [0-1022] (1,023)"


@given(st.sets(st.integers(0, 2000)).filter(bool))
def test_a_rank_list_reads_back_as_the_same_ranks(ranks):
    assert parse_rank_list(rank_list(ranks)) == sorted(ranks)


def test_victims_saying_the_same_thing_share_one_line():
    lines = [f"rank {r}: waiting on rank 17 in #3 all_reduce((1,):float32, SUM) at t.py:9"
             for r in range(1024) if r != 17]  # fmt: skip
    lines.insert(5, "rank 3: still running, in no collective")
    lines.append("injected: kill rank 17 at collective 3")
    grouped = group_rank_lines(lines)
    assert grouped == [
        "ranks [0-16, 18-1023] (1,023): waiting on rank 17 in #3 all_reduce((1,):float32, SUM) "
        "at t.py:9",
        "rank 3: still running, in no collective",
        "injected: kill rank 17 at collective 3",
    ]


def stack(thread_id: str) -> str:
    return (f"last collective entered: #2 barrier() at t.py:4\nstack (all threads):\n"
            f"Current thread 0x{thread_id} (most recent call first):\n"
            f'  File "t.py", line 4 in body')  # fmt: skip


def test_a_thousand_ranks_stopped_at_one_place_make_one_stack_and_a_screenful(tmp_path):
    files = PoolFiles(str(tmp_path), 1024, "gloo")
    failures = {17: 'Traceback (most recent call last):\n  File "t.py", line 3\nValueError: bug'}
    stacks = {r: stack(f"{0x7F0000000000 + r * 4096:016x}") for r in range(1024) if r != 17}
    report = files.report("rank 17 failed first: ValueError: bug", failures, stacks)
    lines = report.splitlines()
    assert "--- ranks [0-16, 18-1023] (1,023) were still running:" in lines
    assert "--- rank 17 failed:" in lines
    assert report.count("Current thread 0x…") == 1, "thread ids differ, the stacks do not"
    assert len(lines) < 20


def test_past_the_first_distinct_failures_each_kind_takes_one_line(tmp_path):
    files = PoolFiles(str(tmp_path), 64, "gloo")
    failures = {r: f'Traceback (most recent call last):\n  File "t.py", line {r}\n'
                   f"ValueError: rank {r}'s own value" for r in range(64)}  # fmt: skip
    lines = files.report("rank(s) [0-63] failed", failures, {}).splitlines()
    full = [ln for ln in lines if ln.startswith("--- rank") and ln.endswith("failed:")]
    assert len(full) == FULL_SECTIONS
    assert "--- rank 63 failed: ValueError: rank 63's own value" in lines
    assert len(lines) == 1 + FULL_SECTIONS * 4 + (64 - FULL_SECTIONS)


def test_past_the_first_distinct_stacks_each_names_its_last_collective(tmp_path):
    files = PoolFiles(str(tmp_path), 20, "gloo")
    stacks = {r: stack("7f00aa00bb00").replace("t.py:4", f"t.py:{r}") for r in range(20)}
    lines = files.report("rank(s) [0-19] did not finish within 5 s", {}, stacks).splitlines()
    assert "--- rank 19 was still running: last collective entered: #2 barrier() at t.py:19" in lines


def test_the_failing_rank_is_shown_in_full_whatever_its_number(tmp_path):
    # The cause is the last rank; the others hang at different lines and print their rank.
    for world in (8, 64):
        files = PoolFiles(str(tmp_path / str(world)), world, "gloo")
        for r in range(world):
            os.makedirs(files.workdir, exist_ok=True)
            with open(files.out_path(r), "w") as f:
                f.write(f"rank {r} says hello\n")
        last = world - 1
        failures = {last: 'Traceback (most recent call last):\n  File "t.py", line 3, in f\n'
                          "ValueError: the real bug"}  # fmt: skip
        stacks = {r: stack("7f00aa00bb00").replace("t.py:4", f"t.py:{r}") for r in range(last)}
        lines = files.report(f"rank {last} failed first", failures, stacks).splitlines()
        assert lines[1] == f"--- rank {last} failed:" and lines[4] == "    ValueError: the real bug"
        assert f"[rank {last}] rank {last} says hello" in lines, "its output comes first"
        if world <= SHOWN_IN_FULL:
            assert sum(ln.endswith("was still running:") for ln in lines) == world - 1
            assert not any("not shown" in ln for ln in lines)


def test_victims_whose_errors_differ_only_in_a_peer_s_port_share_one_line(tmp_path):
    files = PoolFiles(str(tmp_path), 64, "gloo")
    details = [f"rank {r}: failed waiting on rank 9 in #2 barrier(): RuntimeError: Read error "
               f"[127.0.0.1]:{5000 + r}: Connection reset by peer" for r in range(9)]  # fmt: skip
    lines = files.report("rank 9 failed first: killed", {}, {}, details=details).splitlines()
    assert lines[1] == ("    ranks [0-8] (9): failed waiting on rank 9 in #2 barrier(): "
                        "RuntimeError: Read error [127.0.0.1]:…: Connection reset by peer")
