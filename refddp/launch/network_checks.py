"""A node's network, as a multi-node job will use it: the checks of ``python -m refddp.doctor
--network``, run on each node before the job (no process group needed).

What it finds, each in one line naming the node and the fix: a ``GLOO_SOCKET_IFNAME`` that
names no interface here; a host name that resolves to loopback (gloo would listen where no
other node can reach) or to an address this node does not have (a host name copied from
another node); a ``MASTER_ADDR`` that does not resolve or cannot be reached (a timeout: no
route, a firewall, a cut link; "refused" is fine before the job starts: the host answers, and
torchrun will listen there).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import sys
from typing import Any

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interfaces() -> dict[str, str]:
    """This node's interfaces that have an IPv4 address: name -> address (Linux only)."""
    import fcntl  # not on Windows: the doctor imports this module everywhere

    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address
                continue
            found[name] = socket.inet_ntoa(raw[20:24])
    return found


def _resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def gloo_interface(node: str, have: dict[str, str], multi_node: bool = True
                   ) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """Where gloo will listen on this node, and the problems with it (loopback is one only
    for a job of several nodes)."""
    pinned = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if pinned:
        missing = [n for n in pinned.split(",") if n not in have]
        if missing:
            return {"interface": pinned, "address": None, "from": "GLOO_SOCKET_IFNAME"}, [
                f"{node}: GLOO_SOCKET_IFNAME={pinned} names no interface here "
                f"({', '.join(f'{n} {a}' for n, a in have.items())}): set it to the interface "
                "on the network the nodes share, or unset it"
            ]
        name = pinned.split(",")[0]
        return {"interface": name, "address": have[name], "from": "GLOO_SOCKET_IFNAME"}, []
    host = socket.gethostname()
    address = _resolve(host)
    where = {"interface": None, "address": address, "from": f"host name {host}"}
    if address is None:
        return where, [f"{node}: host name {host} does not resolve: add it to /etc/hosts (or "
                       "DNS) with this node's address, or set GLOO_SOCKET_IFNAME"]  # fmt: skip
    owner = next((n for n, a in have.items() if a == address), None)
    where["interface"] = owner
    others = ", ".join(f"{n} {a}" for n, a in have.items() if not a.startswith("127."))
    if ipaddress.ip_address(address).is_loopback:
        if not multi_node:
            return where, []
        return where, [
            f"{node}: host name {host} resolves to {address} (loopback): gloo would listen "
            f"where no other node can reach it; map {host} to this node's address in /etc/hosts "
            f"({others or 'none found'}) or set GLOO_SOCKET_IFNAME"
        ]
    if owner is None:
        return where, [
            f"{node}: host name {host} resolves to {address}, which is not this node's "
            f"({others or 'none found'}): two nodes share a host name, or /etc/hosts is stale; "
            "give each node a unique name that resolves to its own address"
        ]
    return where, []


def master_reachable(node: str, timeout_s: float = 3.0) -> tuple[str, list[str]]:
    """Whether MASTER_ADDR:MASTER_PORT can be reached from this node."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "29500")
    if not addr:
        return "not set", []
    target = f"{addr}:{port}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return "bad port", [f"{node}: MASTER_PORT={port!r} is not a port number (1-65535)"]
    if _resolve(addr) is None:
        return "does not resolve", [f"{node}: MASTER_ADDR {addr} does not resolve: give node "
                                    "0's address or a name every node resolves"]  # fmt: skip
    try:
        with socket.create_connection((addr, int(port)), timeout=timeout_s):
            return "listening", []
    except ConnectionRefusedError:
        return "reachable (nothing listening yet)", []
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (
            os.strerror(exc.errno) if exc.errno else str(exc))  # fmt: skip
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            why = "no route"
        return f"unreachable ({why})", [
            f"{node}: MASTER_ADDR {target} is unreachable ({why}): check that it is node 0's "
            "address on the network the nodes share, that the link is up and no firewall "
            "drops the port"
        ]


def check_node(timeout_s: float = 3.0) -> dict[str, Any]:
    """Every check, on this node. A host name on loopback counts as a problem only where
    MASTER_ADDR names another machine: under c10d rendezvous set it to the rendezvous host
    for this check."""
    if not sys.platform.startswith("linux"):
        return {"node": socket.gethostname(), "interfaces": {}, "gloo": {}, "master": "",
                "problems": ["--network checks Linux nodes only"]}  # fmt: skip
    node = socket.gethostname()
    have = interfaces()
    master = _resolve(os.environ.get("MASTER_ADDR", "") or "localhost")
    multi_node = master is not None and not ipaddress.ip_address(master).is_loopback
    gloo, problems = gloo_interface(node, have, multi_node)
    reached, unreachable = master_reachable(node, timeout_s)
    return {
        "node": node,
        "interfaces": have,
        "gloo": gloo,
        "master": reached,
        "problems": problems + unreachable,
    }


def duplicate_host_names(reports: list[dict[str, Any]]) -> list[str]:
    """Nodes (torchrun's GROUP_RANK) that share a host name, from every rank's report."""
    nodes_of: dict[str, set[int]] = {}
    for r in reports:
        nodes_of.setdefault(r["host"], set()).add(r["node_rank"])
    return [
        f"nodes {sorted(nodes)} share the host name {host}: node-local files and logs keyed by "
        "host name collide, and the name resolves to one of them only; give each node its own"
        for host, nodes in sorted(nodes_of.items())
        if len(nodes) > 1
    ]
