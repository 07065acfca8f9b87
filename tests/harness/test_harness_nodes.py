"""Simulated nodes: each rank sees what torchrun gives on a real multi-node job, and node-local
state (a host name, a node_tmp_path) is its node's own."""

import os
import re
import socket

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure, faults, rank_context

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def where_am_i():
    ctx = rank_context()
    return {
        "env": {name: os.environ.get(name) for name in TORCHRUN_VARIABLES},
        "ctx": (ctx.rank, ctx.node_rank, ctx.local_rank, ctx.local_world_size),
        "host": socket.gethostname(),
        "uname": os.uname().nodename,
        "node_tmp_path": str(ctx.node_tmp_path),
    }


def test_each_rank_sees_torchrun_s_variables_for_its_node(spawn):
    seen = spawn(where_am_i, world_size=4, nnodes=2)
    for rank, s in enumerate(seen):
        node, local = divmod(rank, 2)
        assert s["env"] == {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(local),
                            "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(node)}  # fmt: skip
        assert s["ctx"] == (rank, node, local, 2)
        assert s["uname"] == s["host"]
    hosts = [s["host"] for s in seen]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    dirs = [s["node_tmp_path"] for s in seen]
    assert dirs[0] == dirs[1] != dirs[2] == dirs[3]
    assert os.path.isdir(dirs[0]) and os.path.isdir(dirs[2])


def prepare_once_per_node(first_on_node_by):
    """The classic: one rank per node prepares node-local data, the node's ranks read it.
    ``first_on_node_by`` names the variable that picks that rank: LOCAL_RANK is right; RANK
    finds the first rank of the job only, on node 0."""
    ready = rank_context().node_tmp_path / "dataset.ready"
    if int(os.environ[first_on_node_by]) == 0:
        ready.write_text(f"prepared on {socket.gethostname()}")
    dist.barrier()
    return ready.read_text()


def test_naming_node_local_files_by_rank_passes_on_one_node_and_fails_on_two(spawn):
    assert len(set(spawn(prepare_once_per_node, "RANK", world_size=4, nnodes=1))) == 1
    with pytest.raises(RankFailure) as info:
        spawn(prepare_once_per_node, "RANK", world_size=4, nnodes=2)
    assert set(info.value.failures) == {2, 3}, "node 1 has no rank 0 to prepare its data"
    assert "FileNotFoundError" in info.value.failures[2]
    assert info.value.cause in (2, 3)
    on_two = spawn(prepare_once_per_node, "LOCAL_RANK", world_size=4, nnodes=2)
    assert on_two[0] == on_two[1] != on_two[2] == on_two[3]


def test_a_node_count_that_does_not_divide_the_world_is_a_one_line_failure(spawn):
    with pytest.raises(pytest.fail.Exception, match=r"^nnodes=2 does not divide world_size=3: every node "
                       r"runs the same number of ranks"):  # fmt: skip
        spawn(where_am_i, world_size=3, nnodes=2)
    from refddp.testing import spawn_ranks  # outside pytest: a ValueError, with the same line

    with pytest.raises(ValueError, match=r"^nnodes=2 does not divide world_size=3"):
        spawn_ranks(where_am_i, world_size=3, nnodes=2)


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2"])
def test_a_world_size_that_is_no_count_of_ranks_is_a_one_line_failure(spawn, world_size):
    # A world of 0 ran nothing and its test passed; 1.5 or "2" failed deep in the pool's start.
    line = rf"^world_size must be an int >= 1, not {re.escape(repr(world_size))}$"
    with pytest.raises(pytest.fail.Exception, match=line):
        spawn(where_am_i, world_size=world_size)
    from refddp.testing import spawn_ranks  # outside pytest: a ValueError, with the same line

    with pytest.raises(ValueError, match=line):
        spawn_ranks(where_am_i, world_size=world_size)


def write_marker(name):
    (rank_context().node_tmp_path / f"{name}-{dist.get_rank()}").touch()
    return sorted(os.listdir(rank_context().node_tmp_path))


def test_node_tmp_path_lasts_for_the_whole_test(spawn):
    spawn(write_marker, "first", nnodes=2)
    assert spawn(write_marker, "second", nnodes=2) == [["first-0", "second-0"],
                                                       ["first-1", "second-1"]]  # fmt: skip


def test_without_nodes_ranks_get_no_torchrun_variables_and_no_node_dir(spawn):
    for s in spawn(where_am_i):
        assert s["env"]["LOCAL_RANK"] is None and s["node_tmp_path"] == "None"


def _three_all_reduces() -> float:
    x = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(x)
    return float(x)


def test_a_node_killed_at_a_collective_is_reported_as_lost_with_its_ranks(spawn):
    with pytest.raises(RankFailure) as caught:
        spawn(_three_all_reduces, world_size=6, nnodes=3, faults=[faults.kill_node(1, at=2)])
    report = str(caught.value)
    assert report.startswith("node 1 lost (ranks [2, 3] died); rank 2 failed first"), report
    assert "injected: kill rank 2 at collective #2 all_reduce" in report
    assert report.count("(node 1)") >= 1
    # The next test gets a sound pool.
    assert spawn(_three_all_reduces, world_size=6, nnodes=3) == [6.0**3] * 6


def test_node_faults_need_a_node_and_a_cut_needs_real_nodes(spawn):
    with pytest.raises(ValueError, match=r"faults.kill_node: no node 2: the pool has 2 node\(s\)"):
        spawn(_three_all_reduces, world_size=4, nnodes=2, faults=[faults.kill_node(2, at=1)])
    with pytest.raises(ValueError, match="no node 0: the pool has no nodes"):
        spawn(_three_all_reduces, world_size=4, faults=[faults.kill_node(0, at=1)])
    with pytest.raises(ValueError, match="faults.cut_node needs real nodes"):
        spawn(_three_all_reduces, world_size=4, nnodes=2, faults=[faults.cut_node(1, at=1)])


def test_real_nodes_need_a_node_count(pytester):
    pytester.makepyfile(
        """
        def test_it(spawn):
            spawn(print, world_size=2, real_nodes=True)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*real nodes need a node count*"])
