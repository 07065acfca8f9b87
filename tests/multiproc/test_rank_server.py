"""Ranks are forked from one rank server that imported torch once, and are the driver's own
children: exit codes, signals and orphan handling are those of ranks started directly."""

import os

import torch

from refddp.testing import rank_server
from refddp.testing.warm_pools import PoolKey, close_pool


def where_from():
    with open("/proc/self/cmdline", "rb") as f:
        command = f.read().split(b"\0")
    return {
        "parent": os.getppid(),
        "command": [c.decode() for c in command if c],
        "cuda_initialised": torch.cuda.is_initialized(),
    }


def threads_of(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def test_ranks_are_forked_from_a_single_threaded_server_and_are_the_driver_s_children(spawn):
    close_pool(PoolKey(2))  # a pool started now, whatever ran before
    seen = spawn(where_from)
    server = rank_server.server()
    assert server is not None
    for s in seen:
        assert s["parent"] == os.getpid(), "re-parented to the driver (a child subreaper)"
        assert "refddp.testing.rank_server" in s["command"], s["command"]
        assert not s["cuda_initialised"]
    assert threads_of(server.proc.pid) == 1, "a fork of a multi-threaded server is unsafe"
    assert not rank_server.is_subreaper(), "orphans of later tests must not gather here"


def test_ranks_start_as_fresh_interpreters_where_no_server_can_fork_them(spawn, monkeypatch):
    close_pool(PoolKey(2))
    monkeypatch.setattr(rank_server, "server", lambda: None)
    try:
        seen = spawn(where_from)
    finally:
        close_pool(PoolKey(2))  # the next test gets a forked pool again
    for s in seen:
        assert "refddp.testing.worker" in s["command"] and s["parent"] == os.getpid()


def test_a_server_that_cannot_fork_a_rank_leaves_the_pool_to_fresh_interpreters(spawn, monkeypatch):
    close_pool(PoolKey(2))
    rank_server.server()  # up, then failing to fork

    def refuse(*args, **kwargs):
        raise OSError("the rank server exited")

    monkeypatch.setattr(rank_server.RankServer, "start_rank", refuse)
    try:
        seen = spawn(where_from)
    finally:
        close_pool(PoolKey(2))
    assert all("refddp.testing.worker" in s["command"] for s in seen)
