"""Ranks are forked from one rank server that imported torch once, and are the driver's own
children: exit codes, signals and orphan handling are those of ranks started directly."""

import os
import threading

import pytest
import torch

from refddp.config.torch_support import torch_version
from refddp.testing.driver import rank_server
from refddp.testing.driver.pool import LAZY_CONNECT_FROM, RankPool
from refddp.testing.driver.warm_pools import PoolKey, close_pool
from refddp.testing.rank.worker import IDLE_LOOP_SLACK_NS


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
        assert "refddp.testing.driver.rank_server" in s["command"], s["command"]
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
        assert "refddp.testing.rank.worker" in s["command"] and s["parent"] == os.getpid()


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
    assert all("refddp.testing.rank.worker" in s["command"] for s in seen)


def probe_origin():
    import tests.preload_probe as probe

    return {"imported_in": probe.IMPORTED_IN, "me": os.getpid(), "parent": os.getppid()}


def start_server_with(monkeypatch, preload, thread=False):
    """A fresh rank server, started with ``preload`` (and the probe's thread or not)."""
    rank_server.shutdown_server()
    monkeypatch.setenv(rank_server.PRELOAD_ENV, preload)
    if thread:
        monkeypatch.setenv("REFDDP_TEST_PROBE_THREAD", "1")
    else:
        monkeypatch.delenv("REFDDP_TEST_PROBE_THREAD", raising=False)
    return rank_server.server()


def probes_with_server(monkeypatch, preload, thread=False, world_size=2):
    """Each rank's ``probe_origin`` on a pool forked from a fresh server (and that server)."""
    server = start_server_with(monkeypatch, preload, thread)
    pool = RankPool(world_size)
    try:
        return server, pool.run(probe_origin)
    finally:
        pool.close()
        rank_server.shutdown_server()


def test_preloaded_modules_are_imported_once_by_the_server_not_by_each_rank(monkeypatch):
    server, seen = probes_with_server(monkeypatch, "tests.preload_probe", world_size=3)
    assert {s["imported_in"] for s in seen} == {server.proc.pid}, seen


def test_a_preloaded_module_that_starts_a_thread_leaves_ranks_to_fresh_interpreters(monkeypatch):
    _, seen = probes_with_server(monkeypatch, "tests.preload_probe", thread=True)
    # Forking a process with a thread running may copy a lock it holds: the server refuses,
    # the ranks start afresh and import what their task needs themselves.
    assert all(s["imported_in"] == s["me"] for s in seen), seen


class CutShort:
    """A server's socket whose wait for the reply is interrupted (Ctrl-C, a deadline)."""

    def __init__(self, sock):
        self.sock = sock

    def sendmsg(self, *args):
        return self.sock.sendmsg(*args)

    def recv(self, size):
        raise KeyboardInterrupt

    def close(self):
        self.sock.close()


def test_a_request_to_the_server_cut_short_gives_that_server_up(monkeypatch):
    # Its reply would otherwise answer the next request: a rank started with another's pid.
    rank_server.shutdown_server()
    server = rank_server.server()
    assert server is not None
    real = server.sock
    monkeypatch.setattr(server, "sock", CutShort(real))
    with pytest.raises(KeyboardInterrupt):
        server._call(None)
    monkeypatch.setattr(server, "sock", real)
    server.proc.wait(timeout=10)
    assert not server.alive()
    fresh = rank_server.server()
    try:
        assert fresh is not server and fresh.alive()
    finally:
        rank_server.shutdown_server()


def gloo_loop_slack():
    """Timer slack (ns) of this rank's own thread and of its gloo transport threads."""
    def of(tid):  # a thread's own /proc/<tid> entry has its slack
        with open(f"/proc/{tid}/timerslack_ns") as f:
            return int(f.read())

    slack = {"own": of(threading.get_native_id()), "loops": []}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == "gloo_tcp_loop":
                slack["loops"].append(of(tid))
    return slack


def test_idle_gloo_threads_wake_coarsely_while_the_rank_keeps_precise_sleeps(spawn):
    close_pool(PoolKey(2))
    found = spawn(gloo_loop_slack)
    if not any(slack["loops"] for slack in found):
        pytest.skip("this torch's gloo does not name its transport threads (torch 2.5)")
    for slack in found:
        assert slack["loops"], "every rank's groups have gloo transport threads"
        assert min(slack["loops"]) >= IDLE_LOOP_SLACK_NS, slack
        assert slack["own"] < IDLE_LOOP_SLACK_NS, "a test's sleeps stay precise"


def open_sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # the directory listing's own descriptor, closed since
            pass
    return count


@pytest.mark.skipif(torch_version() < (2, 7), reason="torch < 2.7 connects gloo's full mesh")
def test_a_large_fresh_pool_connects_its_ranks_on_first_use_not_all_pairs_at_start():
    pool = RankPool(LAZY_CONNECT_FROM)
    try:
        before = pool.run(open_sockets)
    finally:
        pool.close()
    # Full mesh: 127 peers x 2 groups (the world's and the fingerprint check's), plus the
    # store's and the driver's sockets. On first use: only those two and a few.
    assert max(before) < 16, before
