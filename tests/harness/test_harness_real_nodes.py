"""The harness's real nodes: ``@pytest.mark.nodes(2, real=True)`` and ``spawn(...,
real_nodes=True)`` run each node's ranks in a network namespace of a ``Cluster``.

A user's code that reads the host name (in C too), resolves the nodes' names, binds its node's
address or keys files by host must see two machines; gloo's traffic must cross the bridge (a
cut link stops it, and the harness reports the hang by rank); the next test gets a sound pool.
Skipped, with the reason, where a rank cannot join a node's namespaces (not root).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure, RankTimeout, faults
from refddp.testing import cluster as cluster_module
from refddp.testing.driver import warm_pools

pytestmark = [
    pytest.mark.skipif(cluster_module.unavailable_to_ranks() is not None,
                       reason=str(cluster_module.unavailable_to_ranks())),  # fmt: skip
    pytest.mark.heavy,  # real nodes: a bridge and namespaces per pool
]
NODE0, NODE1 = ("node0", "10.213.0.1"), ("node1", "10.213.0.2")  # cluster.py's addresses


def gathered(value: object) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


@pytest.mark.multiproc
@pytest.mark.world_size(4)
@pytest.mark.nodes(2, real=True)
def test_each_node_s_ranks_see_their_node_s_host_name_address_and_directory(dist_ctx):
    host = socket.gethostname()
    # os.uname() is the kernel's answer (a UTS namespace), not a patched Python function.
    seen = gathered((host, os.uname().nodename, socket.gethostbyname(host), dist_ctx.node_rank))
    assert seen == [(NODE0[0], *NODE0, 0)] * 2 + [(NODE1[0], *NODE1, 1)] * 2
    other = NODE1 if dist_ctx.node_rank == 0 else NODE0
    assert socket.gethostbyname(other[0]) == other[1]
    # A node's directory is its ranks' own.
    (dist_ctx.node_tmp_path / f"rank{dist_ctx.rank}").write_text(host)
    dist.barrier()
    assert sorted(p.name for p in dist_ctx.node_tmp_path.iterdir()) == [
        f"rank{r}" for r in (0, 1) if dist_ctx.node_rank == 0
    ] + [f"rank{r}" for r in (2, 3) if dist_ctx.node_rank == 1]


@pytest.mark.multiproc
@pytest.mark.world_size(4)
@pytest.mark.nodes(2, real=True)
def test_node_addresses_reach_across_the_bridge_and_loopback_stays_on_the_node(dist_ctx):
    # Rank 0 listens on its node's address and on its node's loopback; rank 2, on the other
    # node, reaches the first, and its own loopback has no such listener.
    port = None
    if dist_ctx.rank == 0:
        on_node, on_loopback = socket.create_server((NODE0[1], 0)), socket.create_server(
            ("127.0.0.1", 0)
        )
        port = (on_node.getsockname()[1], on_loopback.getsockname()[1])
    ports = gathered(port)[0]
    reached = None
    if dist_ctx.rank == 2:
        with socket.create_connection((NODE0[0], ports[0]), timeout=10):
            pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", ports[1]), timeout=10)
        reached = True
    if dist_ctx.rank == 0:
        on_node.settimeout(10)
        on_node.accept()[0].close()
        reached = True
    dist.barrier()
    assert reached or dist_ctx.rank in (1, 3)


def _all_reduces() -> float:
    x = torch.ones(1 << 16)
    for _ in range(3):
        dist.all_reduce(x)
    return float(x[0])


def test_a_node_s_link_cut_at_a_collective_is_a_hang_reported_with_the_cut_named(spawn):
    # Gloo's traffic crosses the bridge: with node 1's link down, collective #2 never ends.
    with pytest.raises(RankTimeout) as caught:
        spawn(_all_reduces, world_size=4, nnodes=2, real_nodes=True, timeout=4,
              faults=[faults.cut_node(1, at=2)])  # fmt: skip
    report = str(caught.value)
    assert report.startswith("rank(s) [0-3] did not finish within 4 s"), report
    assert "injected: cut rank 2 at collective #2 all_reduce" in report and "(node 1)" in report
    # The next test gets a sound pool, on a new cluster whose links are up.
    assert spawn(_all_reduces, world_size=4, nnodes=2, real_nodes=True) == [64.0] * 4


def test_a_node_killed_on_real_nodes_is_reported_as_lost(spawn):
    with pytest.raises(RankFailure) as caught:
        spawn(_all_reduces, world_size=4, nnodes=2, real_nodes=True,
              faults=[faults.kill_node(0, at=1)])  # fmt: skip
    assert str(caught.value).startswith("node 0 lost (ranks [0, 1] died)"), str(caught.value)


def _mounts() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


def test_a_closed_pool_s_namespaces_are_gone_from_another_pool_s_ranks(spawn):
    # Each rank has a mount namespace of its own, made while other pools' namespaces were
    # mounted: a closed pool's must leave it too (the kernel detaches a mount whose mount point
    # `ip netns del` unlinks), or those ranks would pin its namespaces alive.
    spawn(_all_reduces, world_size=2, nnodes=2, real_nodes=True)
    (first,) = [key for key in warm_pools._pools if key.real_nodes and key.world_size == 2]
    names = warm_pools._pools[first].cluster.namespaces()
    seen = spawn(_mounts, world_size=4, nnodes=2, real_nodes=True)  # made while the first lives
    assert all(names[1] in mounts for mounts in seen)  # its namespaces are mounted here
    warm_pools.close_pool(first)
    for mounts in spawn(_mounts, world_size=4, nnodes=2, real_nodes=True):
        assert not any(name in mounts for name in names), mounts
