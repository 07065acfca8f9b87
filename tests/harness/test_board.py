"""The board on which a pool's ranks compare the fingerprints of collectives on groups of every
rank (``refddp/testing/checks/board.py``): every rank gets the same verdict each round, and it
says whether every rank posted the same hash, whatever order and pace the ranks come in.

Ranks are threads here, each with its own ``Board`` (its own file descriptions: the lock and the
wake-ups work between them as between processes); the pools' own tests
(``test_collective_fingerprint.py``, ``test_collective_space.py``) run it between processes."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refddp.testing.checks import board as board_module
from refddp.testing.checks.board import CELL, Board


def run_ranks(workdir: str, posts: list[list[int]], delays: list[list[float]] | None = None,
              boards: list[Board] | None = None) -> list[list[bool]]:  # fmt: skip
    """Each rank posts its row of ``posts`` (one hash a round), after its row of ``delays``;
    returns each rank's verdicts."""
    size = len(posts)
    boards = boards or [Board(workdir, size, rank) for rank in range(size)]
    verdicts: list[list[bool]] = [[] for _ in range(size)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            for round_, digest in enumerate(posts[rank]):
                if delays:
                    time.sleep(delays[rank][round_])
                verdicts[rank].append(boards[rank].all_alike(digest))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads), "a rank is still waiting on the board"
    finally:
        if not any(t.is_alive() for t in threads):
            for b in boards:
                b.close()
    assert not errors, errors
    return verdicts


@settings(max_examples=40, deadline=None)
@given(data=st.data(), size=st.integers(1, 6), rounds=st.integers(1, 8))
def test_every_rank_gets_the_same_true_verdict_at_any_pace(tmp_path_factory, data, size, rounds):
    workdir = str(tmp_path_factory.mktemp("board"))
    posts = [[7] * rounds for _ in range(size)]
    for round_ in range(rounds):  # in some rounds, one rank posts another hash
        odd = data.draw(st.none() | st.integers(0, size - 1), label=f"odd rank in round {round_}")
        if odd is not None:
            posts[odd][round_] = 8
    delays = data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.005]),
                                         min_size=rounds, max_size=rounds),
                                min_size=size, max_size=size), label="delays")  # fmt: skip
    verdicts = run_ranks(workdir, posts, delays)
    expected = [len({posts[r][k] for r in range(size)}) == 1 for k in range(rounds)]
    assert verdicts == [expected] * size


def test_a_rank_slow_to_read_its_round_still_reads_that_rounds_cells(tmp_path, monkeypatch):
    # Rank 1 is descheduled between its wake-up and its read of the cells; rank 0 meanwhile
    # posts the next round's different hash. Rounds alternate halves, so rank 1 still reads
    # round 1's cells (with one half it would read rank 0's round-2 hash as a mismatch).
    boards = [Board(str(tmp_path), 2, rank) for rank in range(2)]
    real_read = os.read

    def slow_read(fd: int, n: int) -> bytes:
        got = real_read(fd, n)
        if threading.current_thread().name == "slow":
            time.sleep(0.3)
        return got

    monkeypatch.setattr(board_module.os, "read", slow_read)
    verdicts: dict[str, list[bool]] = {"fast": [], "slow": []}

    def fast() -> None:
        deadline = time.monotonic() + 10
        while CELL.unpack_from(boards[0]._cells, 0)[0] != 1 and time.monotonic() < deadline:
            time.sleep(0.001)  # until rank 1 has counted itself in: rank 0 then wakes it
        verdicts["fast"].append(boards[0].all_alike(1))
        verdicts["fast"].append(boards[0].all_alike(2))

    def slow() -> None:
        verdicts["slow"].append(boards[1].all_alike(1))
        verdicts["slow"].append(boards[1].all_alike(2))

    threads = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (fast, slow)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting on the board"
    for b in boards:
        b.close()
    assert verdicts == {"fast": [True, True], "slow": [True, True]}


def test_each_halfs_count_is_back_at_0_for_its_next_round(tmp_path):
    # Round 3 uses half 0 again, after round 1: its count must be back at 0. After an odd
    # number of rounds both halves' counts are 0, so boards made afresh on the same file (at
    # round 0, on half 0) go on.
    boards = [Board(str(tmp_path), 3, rank) for rank in range(3)]
    assert run_ranks(str(tmp_path), [[5, 6, 5]] * 3, boards=boards) == [[True] * 3] * 3
    again = [Board(str(tmp_path), 3, rank) for rank in range(3)]
    assert run_ranks(str(tmp_path), [[1, 4], [1, 4], [2, 4]], boards=again) == [[False, True]] * 3


def test_a_rank_taken_out_of_a_round_midway_fails_its_next_round(tmp_path, monkeypatch):
    board = Board(str(tmp_path), 2, 1)

    class Interrupted(BaseException):
        """What a signal handler might raise while the rank waits (a timeout, Ctrl-C)."""

    def interrupted(fd: int, n: int) -> bytes:
        raise Interrupted

    monkeypatch.setattr(board_module.os, "read", interrupted)
    with pytest.raises(Interrupted):
        board.all_alike(3)
    with pytest.raises(RuntimeError, match="broken: this rank left a round midway"):
        board.all_alike(3)
    board.close()
