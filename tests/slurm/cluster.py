"""A one-node SLURM cluster on this machine for the tests marked ``slurm``: ``munged``,
``slurmctld`` and ``slurmd`` (Debian's ``slurm-wlm`` and ``munge``) with their configuration,
state, spool and logs in one temporary directory. Clients (srun, sbatch, scontrol, scancel)
find it through ``SLURM_CONF``; nothing outside the directory is read or changed.

The node is this host at 127.0.0.1, or, given a ``refddp.testing.cluster.Cluster``, each of
its nodes (network namespaces with their own address and host name: SLURM across machines).
``proctrack/linuxproc`` and ``task/none`` need no cgroups,
and the cgroup.conf only keeps slurmd from mounting any (other settings make it fail to start
in a container). Requeued jobs may start again once their credentials expire
(``cred_expire``, 5 s here, 120 s by default) and the scheduler looks every second.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
START_S, JOB_S = 60, 240  # deadlines: the daemons up, a job finished (polling, not sleeping)


def why_not() -> str | None:
    """Why no cluster can start here, or None."""
    absent = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} not found; "
                "apt-get install slurm-wlm munge)")  # fmt: skip
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    try:
        socket.gethostbyname(socket.gethostname())
    except OSError:
        return f"this host's name {socket.gethostname()!r} does not resolve"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A running cluster; ``stop`` ends every job and daemon it started."""

    def __init__(self, root: Path, network: Any = None):
        """``network``: a ``refddp.testing.cluster.Cluster`` whose nodes become the SLURM nodes
        (slurmctld on node 0, a slurmd on each, clients run on node 0); else this host alone."""
        self.root, self.network = root, network
        self.host = "node0" if network is not None else socket.gethostname()
        self.conf = root / "slurm.conf"
        self.pids: list[int] = []

    def _nodes(self) -> list[tuple[str, str]]:
        """(name, address) of each SLURM node."""
        if self.network is None:
            return [(self.host, "127.0.0.1")]
        return [(node.hostname, node.address) for node in self.network.nodes]

    # -- the daemons --------------------------------------------------------------------------

    def start(self) -> Cluster:
        root = self.root
        (root / "state").mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge.socket"
        nodes = "\n".join(f"NodeName={name} NodeAddr={address} CPUs=4 State=UNKNOWN"
                          for name, address in self._nodes())  # fmt: skip
        self.conf.write_text(f"""\
ClusterName=refddp
SlurmctldHost={self.host}({self._nodes()[0][1]})
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
FirstJobId={self.first_job_id()}
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes={",".join(name for name, _ in self._nodes())} Default=YES MaxTime=INFINITE State=UP
""")
        (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        self._daemon("munged", "--force", f"--socket={socket_path}", f"--key-file={key}",
                     f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                     f"--seed-file={root}/munged.seed")  # fmt: skip
        self._daemon("slurmctld", "-i", "-f", str(self.conf), on=0)
        for k, (name, _) in enumerate(self._nodes()):
            self._daemon("slurmd", "-N", name, "-f", str(self.conf), on=k, pid=f"slurmd-{name}")
        deadline = time.monotonic() + START_S
        while self.client("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.count(
            "idle"
        ) < len(self._nodes()):
            assert time.monotonic() < deadline, f"the node never came up:\n{self.logs()}"
            time.sleep(0.2)
        return self

    @staticmethod
    def first_job_id() -> int:
        """Job ids of their own for each cluster on this host (one per pytest-xdist worker):
        srun ranks derive their rendezvous port from the job id, and two clusters numbering
        jobs from 1 would hand two jobs one port."""
        return 1 + (os.getpid() % 1000) * 20

    def _daemon(self, name: str, *args: str, on: int | None = None, pid: str = "") -> None:
        """Start a daemon (each forks into the background), on network node ``on`` if there
        is a network, and remember its pid (from ``pid``.pid, default the daemon's name)."""
        done = subprocess.run(self._on(on, [_which(name) or name, *args]), capture_output=True,
                              text=True, env=self.env(), timeout=60)  # fmt: skip
        assert done.returncode == 0, f"{name} did not start: {done.stderr}\n{self.logs()}"
        pid_file = self.root / f"{pid or name}.pid"
        deadline = time.monotonic() + START_S
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, f"{name} wrote no pid file:\n{self.logs()}"
            time.sleep(0.05)
        self.pids.append(int(pid_file.read_text()))

    def stop(self) -> None:
        """Cancel every job, wait until none is left, then stop the daemons (newest first)."""
        if self.pids:
            self.client("scancel", "--full", "--user", "root", check=False)
            deadline = time.monotonic() + 60
            while self.client("squeue", "-h", check=False).stdout.strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        for pid in reversed(self.pids):
            _terminate(pid)
        self.pids.clear()

    def _on(self, node: int | None, argv: list[str]) -> list[str]:
        """``argv`` as run on network node ``node`` (as it is without a network)."""
        if self.network is None or node is None:
            return argv
        return self.network.command(node, argv, cwd=REPO)

    def logs(self) -> str:
        """The tail of every daemon's log, for failure messages."""
        tails = []
        for path in [self.root / "slurmctld.log", *sorted(self.root.glob("slurmd-*.log")),
                     self.root / "munged.log"]:  # fmt: skip
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-15:]
                tails.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(tails)

    # -- clients ------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client and of the jobs it submits (srun and sbatch pass theirs
        on): this cluster, the test's Python on PATH, one thread per rank."""
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path,
                "OMP_NUM_THREADS": "1", **extra}  # fmt: skip

    def client(self, *cmd: str, check: bool = True, timeout: float = JOB_S,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """Run a client command from the repository root (so ``tests.user_code`` imports)."""
        done = subprocess.run(self._on(0, [_which(cmd[0]) or cmd[0], *cmd[1:]]), cwd=REPO,
                              capture_output=True, text=True, timeout=timeout,
                              env=env or self.env())  # fmt: skip
        if check:
            assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr}\n{self.logs()}"
        return done

    def sbatch(self, script: Path, *args: str, options: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> str:  # fmt: skip
        """Submit ``script`` (with its arguments); the job id."""
        done = self.client("sbatch", "--parsable", *options, str(script), *args, env=env)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        text = self.client("scontrol", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for(self, predicate: Callable[[], bool], what: str, log: Path) -> None:
        """Poll ``predicate`` while the job whose output is ``log`` runs."""
        deadline = time.monotonic() + JOB_S
        while not predicate():
            if time.monotonic() > deadline:
                output = log.read_text() if log.exists() else "(no output)"
                raise AssertionError(f"timed out waiting for {what}:\n{output}\n{self.logs()}")
            time.sleep(0.05)

    def wait_until_finished(self, job_id: str, timeout: float = JOB_S) -> dict[str, str]:
        """Poll the job until it has ended for good (a requeued job passes through PENDING)."""
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id))["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED",
                                                              "TIMEOUT", "NODE_FAIL"):  # fmt: skip
            assert time.monotonic() < deadline, f"job {job_id} still {job['JobState']}"
            time.sleep(0.2)
        return job


def _terminate(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM one daemon this cluster started, SIGKILL if it is still there after the grace."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:  # a daemon's parent is init, which may reap it late: a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
