"""The namespace plumbing under ``refddp.testing.cluster.Cluster``: how namespaces can be made
here, the ``ip`` calls, the user-namespace holder, the reaper, and the removal of a cluster's
namespaces (every process in them killed) and of those a dead process left.

Its own module because it also runs as a script, by path and isolated (``python -I
namespaces.py --reap|--hold|--probe``): as the reaper (root's, from "/", so nothing in a test's
working directory may shadow what it imports) and as the maker of a cluster's user namespace.
So it imports nothing but the standard library (refddp itself may not be importable there).
The Cluster API, its nodes and faults are ``refddp/testing/cluster.py``'s.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

PREFIX = "refddp-"  # every namespace a cluster makes: refddp-<pid>-<n>-<node|switch>
_NAME = re.compile(rf"^{PREFIX}(\d+)-")  # the pid of the process that made it


@functools.cache
def how() -> tuple[str, str]:
    """How clusters are made here: ``("direct", "")`` (root with its capabilities: namespaces
    in the machine's lists), ``("user", "")`` (anyone else, where the kernel allows it: inside
    a user namespace of the cluster's own), or ``("", why not)``."""
    if not sys.platform.startswith("linux"):
        return "", "a cluster of network namespaces needs Linux"
    for tool in ("ip", "unshare", "tc", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return "", f"a cluster needs the `{tool}` command (iproute2, util-linux)"
    direct = "not root"
    if os.geteuid() == 0:  # (root in a container may lack CAP_NET_ADMIN or CAP_SYS_ADMIN)
        probe = f"{PREFIX}{os.getpid()}-probe-switch"
        made = ip("netns", "add", probe, check=False)
        ip("netns", "del", probe, check=False)
        if not made.returncode:
            return "direct", ""
        direct = made.stderr.strip() or f"ip netns add: exit {made.returncode}"
    made = subprocess.run(holder_command("--probe"), capture_output=True, text=True)
    if not made.returncode:
        return "user", ""
    said = (made.stderr.strip().splitlines() or [f"exit {made.returncode}"])[-1]
    return "", (f"cannot make a network namespace here ({direct}) nor a user namespace to make "
                f"one in ({said}); run the cluster tests as root, or where unprivileged user "
                "namespaces are allowed")  # fmt: skip


def ip(*args: str, check: bool = True, via: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``ip ARGS``, run through ``via`` (a cluster's way into its user namespace, if it has one)."""
    done = subprocess.run([*via, "ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def holder_command(*args: str) -> list[str]:
    """This module, run as the maker of a user namespace with a network and mount namespace of
    its own (where its caller is root)."""
    return ["unshare", "--user", "--map-root-user", "--net", "--mount", "--",
            sys.executable, "-I", os.path.abspath(__file__), *args]  # fmt: skip


def reaper_command(*args: str) -> list[str]:
    """This module, run as root's reaper of a cluster (``--reap``; by path and isolated)."""
    return [sys.executable, "-I", os.path.abspath(__file__), *args]


def _private_netns_list() -> None:
    """In a user namespace's own mount namespace: a ``/run/netns`` of its own for ``ip netns``
    (the machine's is root's to write). Where the machine has none, a ``/run`` of its own,
    which hides the machine's (``/run/user``, a resolver's socket) from what runs on the nodes:
    their names resolve through their hosts files."""
    if not os.path.isdir("/run/netns"):
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
        os.mkdir("/run/netns")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/netns"], check=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    listed = ip("netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith(PREFIX)]


def pids_in(namespace: str, via: Sequence[str] = ()) -> list[int]:
    listed = ip("netns", "pids", namespace, check=False, via=via).stdout.split()
    return [int(p) for p in listed if p.isdigit()]


def signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_inside(namespace: str, via: Sequence[str] = ()) -> None:
    """SIGKILL every process in ``namespace``, again until none is left (one may have forked
    between the listing and the kill): deleting a namespace's name does not stop them."""
    for _ in range(50):
        pids = pids_in(namespace, via)
        if not pids:
            return
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.02)


def remove(namespaces: Sequence[str], via: Sequence[str] = ()) -> None:
    """Kill what runs in ``namespaces``, delete them and their hosts files (idempotent)."""
    for namespace in namespaces:
        kill_inside(namespace, via)
    for namespace in namespaces:
        ip("netns", "del", namespace, check=False, via=via)
        if not via:
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)


def sweep() -> list[str]:
    """Remove the namespaces of clusters whose process has died; the names removed."""
    stale = [n for n in _namespaces() if (m := _NAME.match(n)) and not _alive(int(m.group(1)))]
    remove(stale)
    return stale


def _reap(argv: list[str]) -> None:
    """``OWNER HOSTS_DIR|- NAMESPACE...``: wait for ``owner`` to die, then remove its cluster's
    namespaces (and, without root, the directory of its hosts files)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the test run
    owner, hosts_dir, namespaces = int(argv[0]), argv[1], argv[2:]
    while _alive(owner):
        time.sleep(0.5)
    remove(namespaces)
    if hosts_dir != "-":
        shutil.rmtree(hosts_dir, ignore_errors=True)


def _hold(argv: list[str]) -> None:
    """The maker of a cluster's user namespace (run by ``holder_command``): its own
    ``/run/netns``, then "ready" to the cluster, then the reaper's wait."""
    try:
        _private_netns_list()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"cannot mount a private /run/netns: {exc}", flush=True)
        sys.exit(1)
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the cluster reads no more from it
    if argv[:1] == ["--reap"]:
        _reap(argv[1:])


def _probe() -> None:
    """Whether a cluster can be made here without root (run by ``holder_command``)."""
    _private_netns_list()
    probe = f"{PREFIX}probe"
    ip("netns", "add", probe)
    ip("link", "add", "probe0", "type", "veth", "peer", "name", "probe1", "netns", probe)


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--reap":
        _reap(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--hold":
        _hold(sys.argv[2:])
    elif sys.argv[1:] == ["--probe"]:
        try:
            _probe()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            sys.exit(str(exc))
