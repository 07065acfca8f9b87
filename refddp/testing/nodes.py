"""Simulated nodes: one machine's ranks grouped as ``nnodes`` nodes, as torchrun numbers them.

With ``spawn(fn, world_size=4, nnodes=2)`` or ``@pytest.mark.nodes(2)``, rank r runs on node
``r // local_world_size`` as local rank ``r % local_world_size``, with the variables torchrun
sets on a real multi-node job, a host name of its node's own (``socket.gethostname()``,
``platform.node()``, ``os.uname()``: Python-level, so code that names files or logs by host sees
the nodes apart; C code and gloo, pinned to loopback, see the machine's), its node's share of
the pool's GPUs (``CUDA_VISIBLE_DEVICES``, indexed by local rank) and a ``node_tmp_path``
shared by its node's ranks only.
"""

from __future__ import annotations

import os
import platform
import socket
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


def layout(world_size: int, nnodes: int | None) -> NodeLayout | None:
    """The layout, None without nodes; a ValueError in one line when ``nnodes`` cannot split
    ``world_size`` into equal nodes."""
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
    first = nodes.node_of(rank) * nodes.local_world_size
    return devices[first : first + nodes.local_world_size]


def take_node_hostname() -> None:
    """On a rank of a simulated node: Python-level host name queries answer its node's name."""
    name = os.environ.get("REFDDP_NODE_HOSTNAME")
    if not name:
        return
    real = os.uname()
    socket.gethostname = lambda: name
    os.uname = lambda: os.uname_result((real.sysname, name, *real[2:]))
    platform._uname_cache = None  # type: ignore[attr-defined] # computed from os.uname, maybe
    os.environ["HOSTNAME"] = name
