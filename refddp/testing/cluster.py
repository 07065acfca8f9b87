"""A cluster of real nodes on one Linux machine, for tests of multi-node jobs.

Each node is a network namespace with one interface, ``eth0``, and an address of its own on a
private subnet; a bridge in a namespace of its own joins them (the machine's own network is
never touched). A command run on node k gets the node's host name (a UTS namespace) and an
``/etc/hosts`` that names every node (``/etc/netns/<namespace>/hosts``, which ``ip netns exec``
mounts over the machine's), so host names resolve to the nodes' addresses, as on a cluster, and
gloo, binding to the address its host name resolves to, talks over the bridge. A node's link
can be cut and restored (its bridge port set down: the cable pulled) or rate-limited (``tc
tbf``); a node can be made slow (its processes stopped and continued in turn: a machine with
less CPU) or killed (every process in its namespace, SIGKILL).

Creating namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) or, for anyone else, a kernel
that allows unprivileged user namespaces: then the cluster lives inside a user namespace of its
own (``unshare --user --map-root-user``, where its maker is root and nobody else is), with its
network namespaces listed only there (a private ``/run/netns``), its hosts files in a temporary
directory, and commands on a node entered through ``nsenter``. ``unavailable()`` says in one
line why no cluster can be made here, for a test to skip on. Nothing outlives a cluster:
``close()`` (also at the end of a ``with`` block) kills what runs on its nodes and deletes its
namespaces (their interfaces with them) and hosts files; a reaper process does the same if the
process that made the cluster dies first (a killed test run), and each new cluster made as root
first removes what a dead process left (one made without root leaves nothing in the machine's
lists: its namespaces go with the user namespace's last process).

This module is the Cluster API (its nodes, what runs on them, their faults); the plumbing under
it (the ``ip`` calls, the user-namespace holder, the reaper, the removal of namespaces) is
``refddp/testing/nodes/namespaces.py``'s.

    with Cluster(2) as cluster:
        node = cluster.popen(1, ["python", "-m", "torch.distributed.run", ...])
        cluster.cut(1)  # node 1's link down
"""

from __future__ import annotations

import itertools
import numbers
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from refddp.config.validation import seconds_error
from refddp.testing.nodes.namespaces import (
    PREFIX,
    holder_command,
    how,
    ip,
    kill_inside,
    pids_in,
    reaper_command,
    remove,
    signal_all,
    sweep,
)

SUBNET = "10.213.0"  # private to the cluster's own namespaces
_made = itertools.count()


class Node(NamedTuple):
    index: int
    hostname: str  # "node0"
    address: str  # "10.213.0.1"
    namespace: str


def unavailable() -> str | None:
    """Why no cluster can be made here, in one line; None when one can (asked once)."""
    return how()[1] or None


def in_user_namespace() -> bool:
    """Whether clusters here live in a user namespace of their own (no root's capabilities):
    their namespaces are then in no list of the machine's, and no rank can join them."""
    return how()[0] == "user"


def unavailable_to_ranks() -> str | None:
    """Why the harness's ranks cannot be put on real nodes here, or None: a rank joins its
    node's namespaces itself, which takes root's capabilities (a cluster made inside a user
    namespace is out of a rank's reach)."""
    if unavailable():
        return unavailable()
    if in_user_namespace():
        return ("real nodes in the harness need root's capabilities (CAP_SYS_ADMIN, "
                "CAP_NET_ADMIN: a rank joins its node's namespaces); without them a Cluster "
                "runs whole commands on nodes")  # fmt: skip
    return None


def throttle_error(share: Any, period_s: Any) -> str:
    """Why ``Cluster.throttle`` cannot run with these arguments ("" if it can): a ``share``
    that is no number in (0, 1), or a ``period_s`` that is no number of seconds > 0 and at most
    a week. Checked before the duty cycle's thread starts: ``time.sleep(NaN)`` raises there,
    and the node would run at full speed while the test believed it slow."""
    if not (isinstance(share, numbers.Real) and 0 < share < 1):  # (NaN fails too)
        return f"share must lie between 0 and 1 (exclusive), got {share!r}"
    why = seconds_error(period_s)
    return f"period_s: {why}" if why else ""


class Cluster:
    """``nnodes`` nodes joined by a bridge (see the module's docstring)."""

    def __init__(self, nnodes: int = 2):
        if not 1 <= nnodes <= 200:
            raise ValueError(f"nnodes must be 1-200, not {nnodes}")
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self.rootless = in_user_namespace()  # then in a user namespace of its own
        self._nsenter: list[str] = []  # the way into it, for `ip` and what runs on a node
        self._hosts_dir = tempfile.mkdtemp(prefix="refddp-cluster-") if self.rootless else ""
        if not self.rootless:
            sweep()
        tag = f"{PREFIX}{os.getpid()}-{next(_made)}"
        self.switch = f"{tag}-switch"
        self.nodes = [Node(k, f"node{k}", f"{SUBNET}.{k + 1}", f"{tag}-node{k}")
                      for k in range(nnodes)]  # fmt: skip
        self._reaper: subprocess.Popen | None = None
        # Without root: the process whose user namespace holds the cluster (its reaper too).
        self.user_namespace_pid: int | None = None
        self._procs: list[subprocess.Popen] = []
        self._throttled: dict[int, tuple[threading.Event, threading.Thread]] = {}
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        names = [self.switch] + [n.namespace for n in self.nodes]
        # The reaper first: from here on, the namespaces go when this process does.
        # By path, isolated (-I) and from "/": it runs as root, so no module from the test's
        # working directory may shadow anything it imports. Without root it is also the
        # maker of the cluster's user namespace, which lives as long as it does.
        reap = ["--reap", str(os.getpid()), self._hosts_dir or "-", *names]
        said = subprocess.PIPE if self.rootless else subprocess.DEVNULL
        self._reaper = subprocess.Popen(
            holder_command("--hold", *reap) if self.rootless
            else reaper_command(*reap),
            stdin=subprocess.DEVNULL, stdout=said, stderr=said, start_new_session=True, cwd="/",
            text=True,
        )  # fmt: skip
        if self.rootless:
            self._await_user_namespace(self._reaper)
            self.user_namespace_pid = self._reaper.pid
            self._nsenter = ["nsenter", "-t", str(self._reaper.pid), "--user", "--mount", "--net",
                             "--preserve-credentials"]  # fmt: skip
        self._ip("netns", "add", self.switch)
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.hostname}\n" for n in self.nodes)
        for node in self.nodes:
            self._ip("netns", "add", node.namespace)
            port = f"port{node.index}"
            self._ip("link", "add", "eth0", "netns", node.namespace, "type", "veth",
                     "peer", "name", port, "netns", self.switch)  # fmt: skip
            self._ip("-n", self.switch, "link", "set", port, "master", "br0")
            self._ip("-n", self.switch, "link", "set", port, "up")
            self._ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", "eth0")
            self._ip("-n", node.namespace, "link", "set", "eth0", "up")
            self._ip("-n", node.namespace, "link", "set", "lo", "up")
            os.makedirs(os.path.dirname(self.hosts_file(node.index)), exist_ok=True)
            with open(self.hosts_file(node.index), "w") as f:
                f.write(hosts)

    @staticmethod
    def _await_user_namespace(holder: subprocess.Popen, timeout_s: float = 30) -> None:
        """Wait for the holder's "ready"; else a one-line error with what it said."""
        assert holder.stdout is not None and holder.stderr is not None
        line = ""
        if select.select([holder.stdout], [], [], timeout_s)[0]:
            line = holder.stdout.readline().strip()
        if line == "ready":
            holder.stdout.close()
            holder.stderr.close()  # (it writes nothing more)
            return
        holder.kill()
        _, err = holder.communicate()
        why = line or (err.strip().splitlines() or [f"exit {holder.returncode}"])[-1]
        raise RuntimeError(f"the cluster's user namespace could not be made: {why}")

    def _enter(self, wd: str | None = None) -> list[str]:
        """The prefix that runs a command inside the cluster's user namespace, in ``wd`` (its
        mounts start at /); none as root."""
        if not self._nsenter:
            return []
        return [*self._nsenter, *([f"--wd={wd}"] if wd else []), "--"]

    def _ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return ip(*args, check=check, via=self._enter())

    # -- running things on a node -----------------------------------------------------------

    def command(self, k: int, argv: Sequence[str], hostname: str | None = None,
                cwd: str | os.PathLike | None = None) -> list[str]:  # fmt: skip
        """``argv`` as run on node ``k``: in its namespace, under its host name (or
        ``hostname``, to plant a misconfigured one), with the node's hosts file as /etc/hosts
        (``ip netns exec`` mounts it as root; without root the command mounts it itself).
        ``cwd``: where it runs without root (entering a user namespace's mounts starts at /;
        default: here)."""
        node = self.nodes[k]
        name = hostname or node.hostname
        if not self.rootless:
            return ["ip", "netns", "exec", node.namespace, "unshare", "--uts", "--", "sh", "-c",
                    'hostname "$0" && exec "$@"', name, *argv]  # fmt: skip
        where = os.path.abspath(cwd if cwd is not None else os.getcwd())
        return [*self._enter(where), "ip", "netns", "exec", node.namespace,
                "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"',
                name, self.hosts_file(k), *argv]  # fmt: skip

    def popen(self, k: int, argv: Sequence[str], hostname: str | None = None,
              **kwargs: Any) -> subprocess.Popen:  # fmt: skip
        """Start ``argv`` on node ``k`` (``subprocess.Popen``'s keywords apply); it is killed
        with the node or the cluster."""
        proc = subprocess.Popen(self.command(k, argv, hostname, kwargs.get("cwd")), **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, k: int, argv: Sequence[str], timeout: float = 60, **kwargs: Any):
        """Run ``argv`` on node ``k`` to completion, output captured as text."""
        return subprocess.run(self.command(k, argv, cwd=kwargs.get("cwd")), capture_output=True,
                              text=True, timeout=timeout, **kwargs)  # fmt: skip

    # -- faults ------------------------------------------------------------------------------

    def kill(self, k: int) -> None:
        """Node ``k`` dies: every process in its namespace is SIGKILLed."""
        kill_inside(self.nodes[k].namespace, self._enter())

    def cut(self, k: int) -> None:
        """Pull node ``k``'s cable: its bridge port goes down; packets are lost, no reset sent."""
        self._ip("-n", self.switch, "link", "set", f"port{k}", "down")

    def restore(self, k: int) -> None:
        self._ip("-n", self.switch, "link", "set", f"port{k}", "up")

    def slow(self, k: int, rate: str = "1mbit") -> None:
        """Limit node ``k``'s link to ``rate`` both ways (``tc tbf``)."""
        for namespace, dev in ((self.switch, f"port{k}"), (self.nodes[k].namespace, "eth0")):
            subprocess.run([*self._enter(), "ip", "netns", "exec", namespace, "tc", "qdisc",
                            "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
                            "latency", "400ms"], check=True, capture_output=True)  # fmt: skip

    def throttle(self, k: int, share: float = 0.5, period_s: float = 0.02) -> None:
        """Node ``k`` runs ``share`` of the time, until ``unthrottle(k)``: every ``period_s``
        its processes are stopped (SIGSTOP) for the rest of the period, then continued: a
        machine with less CPU, as the other nodes see it."""
        error = throttle_error(share, period_s)
        if error:
            raise ValueError(f"throttle: {error}")
        self.unthrottle(k)
        done = threading.Event()

        def duty_cycle() -> None:
            pids: list[int] = []
            listed = 0.0
            try:
                while not done.is_set():
                    if time.monotonic() - listed > 0.5:  # new processes (a rank's workers) too
                        listed = time.monotonic()
                        pids = pids_in(self.nodes[k].namespace, self._enter())
                    signal_all(pids, signal.SIGSTOP)
                    time.sleep(period_s * (1 - share))
                    signal_all(pids, signal.SIGCONT)
                    done.wait(period_s * share)
            finally:  # never left stopped, whatever ended the loop
                signal_all(pids, signal.SIGCONT)
                signal_all(pids_in(self.nodes[k].namespace, self._enter()), signal.SIGCONT)

        thread = threading.Thread(target=duty_cycle, name=f"throttle-node{k}", daemon=True)
        thread.start()
        self._throttled[k] = (done, thread)

    def unthrottle(self, k: int) -> None:
        """Node ``k`` at full speed again (every process continued)."""
        done, thread = self._throttled.pop(k, (None, None))
        if done is not None and thread is not None:
            done.set()
            thread.join()

    # -- life cycle --------------------------------------------------------------------------

    def hosts_file(self, k: int) -> str:
        """Node ``k``'s ``/etc/hosts`` (every node named), to plant a bad entry in."""
        if self.rootless:
            return os.path.join(self._hosts_dir, self.nodes[k].namespace, "hosts")
        return f"/etc/netns/{self.nodes[k].namespace}/hosts"

    def namespaces(self) -> list[str]:
        return [self.switch] + [n.namespace for n in self.nodes]

    def close(self) -> None:
        """Kill everything on the nodes and remove the cluster (idempotent)."""
        for k in list(self._throttled):
            self.unthrottle(k)
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        # (Without root, the reaper holds the namespaces: they are removed through it, and
        # there is nothing to remove when it could not make them.)
        if self._reaper is not None and (self._nsenter or not self.rootless):
            remove([n.namespace for n in self.nodes] + [self.switch], self._enter())
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._reaper is not None and self._reaper.poll() is None:
            self._reaper.kill()
            self._reaper.wait()
        self._reaper = None
        if self._hosts_dir:
            shutil.rmtree(self._hosts_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
