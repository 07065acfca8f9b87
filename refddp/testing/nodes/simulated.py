"""Simulated nodes: one machine's ranks grouped as ``nnodes`` nodes, as torchrun numbers them.

With ``spawn(fn, world_size=4, nnodes=2)`` or ``@pytest.mark.nodes(2)``, rank r runs on node
``r // local_world_size`` as local rank ``r % local_world_size``, with the variables torchrun
sets on a real multi-node job, a host name of its node's own (``socket.gethostname()``,
``platform.node()``, ``os.uname()``: Python-level, so code that names files or logs by host sees
the nodes apart; C code and gloo, pinned to loopback, see the machine's), its node's share of
the pool's GPUs (``CUDA_VISIBLE_DEVICES``, indexed by local rank) and a ``node_tmp_path``
shared by its node's ranks only.

With ``real=True`` (``@pytest.mark.nodes(2, real=True)``, ``spawn(..., nnodes=2,
real_nodes=True)``) each node is a node of a ``cluster.Cluster`` instead: its ranks run in the
node's network namespace, with its own interface and address, under its host name (a UTS
namespace: C code sees it too) and with an ``/etc/hosts`` that names every node (a mount
namespace), and gloo talks over the cluster's bridge. Needs root, as the cluster does.
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import os
import platform
import socket
from collections.abc import Iterator
from typing import NamedTuple


class NodeLayout(NamedTuple):
    world_size: int
    nnodes: int

    @property
    def local_world_size(self) -> int:
        return self.world_size // self.nnodes

    def node_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def local_rank_of(self, rank: int) -> int:
        return rank % self.local_world_size

    def ranks_of(self, node: int) -> range:
        return range(node * self.local_world_size, (node + 1) * self.local_world_size)


def layout(world_size: int, nnodes: int | None) -> NodeLayout | None:
    """The layout, None without nodes; a ValueError in one line when ``world_size`` is no
    count of ranks (a world of 0 ran nothing, and its test passed) or ``nnodes`` cannot split it
    into equal nodes."""
    try:
        count = operator.index(world_size)  # (an int, or one of numpy's)
    except TypeError:
        count = 0
    if isinstance(world_size, bool) or count < 1:
        raise ValueError(f"world_size must be an int >= 1, not {world_size!r}")
    if nnodes is None:
        return None
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be an int >= 1, not {nnodes!r}")
    if world_size % nnodes:
        raise ValueError(
            f"nnodes={nnodes} does not divide world_size={world_size}: every node runs the "
            "same number of ranks (use a world size that is a multiple of nnodes)"
        )
    return NodeLayout(world_size, nnodes)


def torchrun_environment(nodes: NodeLayout, rank: int) -> dict[str, str]:
    """What torchrun gives rank ``rank`` on a multi-node job of this layout."""
    node, local = nodes.node_of(rank), nodes.local_rank_of(rank)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(nodes.world_size),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(nodes.local_world_size),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nodes.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(nodes.world_size),
        "REFDDP_NODE_HOSTNAME": f"{socket.gethostname()}-node{node}",
    }


def node_devices(nodes: NodeLayout | None, devices: tuple[str, ...], rank: int) -> tuple[str, ...]:
    """The GPUs rank ``rank`` sees: its node's share of the pool's (all of them without nodes)."""
    if nodes is None or not devices:
        return devices
    mine = nodes.ranks_of(nodes.node_of(rank))
    return devices[mine.start : mine.stop]


def real_node_environment(namespace: str, hostname: str, hosts_file: str) -> dict[str, str]:
    """What a rank of a real node (a cluster's) is told of it: where ``enter_real_node`` takes
    it, and the interface gloo binds (the node's own, not loopback)."""
    return {
        NETNS_ENV: f"/var/run/netns/{namespace}",
        "REFDDP_NODE_HOSTNAME": hostname,
        HOSTS_ENV: hosts_file,
        "GLOO_SOCKET_IFNAME": "eth0",
    }


NETNS_ENV, HOSTS_ENV = "REFDDP_NODE_NETNS", "REFDDP_NODE_HOSTS"
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000
_MS_BIND, _MS_REC, _MS_SLAVE = 4096, 16384, 1 << 19
_host_network: int | None = None  # this machine's network namespace, on a real node's rank


def on_real_node() -> bool:
    return bool(os.environ.get(NETNS_ENV))


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def enter_real_node() -> None:
    """On a rank of a real node, before it starts a thread: take the node's host name, hosts
    file and network namespace (keeping this machine's, for ``host_network``)."""
    global _host_network
    if not on_real_node():
        return
    _host_network = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    node_network = os.open(os.environ[NETNS_ENV], os.O_RDONLY | os.O_CLOEXEC)
    _libc_call("unshare", _CLONE_NEWUTS | _CLONE_NEWNS)
    name = os.environ["REFDDP_NODE_HOSTNAME"].encode()
    _libc_call("sethostname", name, len(name))
    # Mounts made here stay here, and the machine's still come in (a namespace deleted there,
    # another pool's, goes here too), as `ip netns exec` does it: the node's hosts file over
    # /etc/hosts, for this rank and what it starts.
    _libc_call("mount", b"none", b"/", None, _MS_REC | _MS_SLAVE, None)
    _libc_call("mount", os.environ[HOSTS_ENV].encode(), b"/etc/hosts", None, _MS_BIND, None)
    _libc_call("setns", node_network, _CLONE_NEWNET)
    os.close(node_network)
    os.environ["HOSTNAME"] = name.decode()


@contextlib.contextmanager
def host_network() -> Iterator[None]:
    """Sockets made inside belong to this machine's network (on a real node's rank; elsewhere
    nothing changes): the pool's store listens on this machine's loopback, which a node's
    network cannot reach. A socket keeps the namespace it was made in."""
    if _host_network is None:
        yield
        return
    node_network = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _libc_call("setns", _host_network, _CLONE_NEWNET)
        try:
            yield
        finally:
            _libc_call("setns", node_network, _CLONE_NEWNET)
    finally:
        os.close(node_network)


def take_node_hostname() -> None:
    """On a rank of a simulated node: Python-level host name queries answer its node's name.
    (A real node's rank has it from the kernel: ``enter_real_node``.)"""
    name = os.environ.get("REFDDP_NODE_HOSTNAME")
    if not name or on_real_node():
        return
    real = os.uname()
    socket.gethostname = lambda: name
    os.uname = lambda: os.uname_result((real.sysname, name, *real[2:]))
    platform._uname_cache = None  # type: ignore[attr-defined] # computed from os.uname, maybe
    os.environ["HOSTNAME"] = name
