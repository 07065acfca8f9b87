"""``python -m refddp.doctor --network`` on real nodes (``refddp.testing.Cluster``): each
planted misconfiguration of a multi-node job is one line naming the node and the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from refddp.testing import cluster as cluster_module
from refddp.testing.cluster import Cluster
from tests.cli_runs import REPO

pytestmark = [
    pytest.mark.skipif(cluster_module.unavailable() is not None,
                       reason=str(cluster_module.unavailable())),  # fmt: skip
    pytest.mark.heavy,  # real nodes
]
DOCTOR = [sys.executable, "-m", "refddp.doctor", "--network"]


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2) as made:
        yield made


def doctor(cluster: Cluster, k: int, hostname: str | None = None, **env: str):
    environment = {**os.environ, "MASTER_ADDR": "node0", "MASTER_PORT": "29500", **env}
    return subprocess.run(cluster.command(k, DOCTOR, hostname, cwd=REPO), capture_output=True,
                          text=True, env=environment, cwd=REPO, timeout=60)  # fmt: skip


def problems(done: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in done.stdout.splitlines() if ln.startswith("PROBLEM: ")]


def test_a_sound_node_passes_and_says_where_gloo_listens(cluster):
    done = doctor(cluster, 1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gloo listens on eth0 10.213.0.2 (from host name node1)" in done.stdout
    assert "MASTER_ADDR:MASTER_PORT: reachable (nothing listening yet)" in done.stdout
    assert done.stdout.rstrip().endswith("OK: no problems found")


def test_a_gloo_interface_that_is_not_there_is_named(cluster):
    done = doctor(cluster, 1, GLOO_SOCKET_IFNAME="eth9")
    assert done.returncode == 1
    assert problems(done) == [
        "PROBLEM: node1: GLOO_SOCKET_IFNAME=eth9 names no interface here (lo 127.0.0.1, eth0 "
        "10.213.0.2): set it to the interface on the network the nodes share, or unset it"
    ]


@pytest.mark.parametrize("how", ["no such host", "link cut"])
def test_an_unreachable_master_is_named(cluster, how):
    if how == "link cut":
        cluster.cut(1)
    try:
        done = doctor(cluster, 1, MASTER_ADDR="10.213.0.99" if how == "no such host" else "node0")
    finally:
        cluster.restore(1)
    assert done.returncode == 1
    [line] = problems(done)
    target = "10.213.0.99:29500" if how == "no such host" else "node0:29500"
    assert line.startswith(f"PROBLEM: node1: MASTER_ADDR {target} is unreachable ("), line
    assert "node 0's address on the network the nodes share" in line


def test_a_host_name_resolving_to_loopback_is_named(cluster):
    hosts = cluster.hosts_file(1)
    with open(hosts) as f:
        kept = f.read()
    with open(hosts, "w") as f:
        f.write("127.0.1.1 node1\n" + kept)  # as Debian's installer writes it
    try:
        done = doctor(cluster, 1)
    finally:
        with open(hosts, "w") as f:
            f.write(kept)
    assert done.returncode == 1
    [line] = problems(done)
    assert line.startswith("PROBLEM: node1: host name node1 resolves to 127.0.1.1 (loopback): "
                           "gloo would listen where no other node can reach it"), line  # fmt: skip
    assert "(eth0 10.213.0.2)" in line


def test_two_nodes_with_one_host_name_are_named(cluster):
    done = doctor(cluster, 1, hostname="node0")  # node 1 set up with node 0's name
    assert done.returncode == 1
    [line] = problems(done)
    assert line == (
        "PROBLEM: node0: host name node0 resolves to 10.213.0.1, which is not this node's "
        "(eth0 10.213.0.2): two nodes share a host name, or /etc/hosts is stale; give each "
        "node a unique name that resolves to its own address"
    )
