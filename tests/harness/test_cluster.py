"""The trainer on a cluster of real nodes on this machine (``refddp.testing.cluster``): network
namespaces with their own interface, address and host name, joined by a bridge.

Plain torchrun on each node, as users start multi-node jobs: the static way (``--master-addr``
by host name, ``--node-rank``) and c10d rendezvous by host name; gloo finds its interface from
the node's host name. A node killed mid-run and a link cut mid-run must end the job in bounded
time, and the rerun must finish as if nothing happened. Made as root, or without root inside a
user namespace (``test_cluster_unprivileged.py`` runs these tests so); skipped, with the
reason, where neither can be made.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from refddp.testing import cluster as cluster_module
from refddp.testing.cluster import Cluster
from refddp.testing.nodes.namespaces import PREFIX
from tests.cli_runs import REPO, run, train_command

pytestmark = [
    pytest.mark.skipif(cluster_module.unavailable() is not None,
                       reason=str(cluster_module.unavailable())),  # fmt: skip
    pytest.mark.slow,  # real nodes, each test whole jobs on them: 20-80 s each
    pytest.mark.heavy,
]
DATA = "tests.user_code:slow_train_datasets"  # $REFDDP_TEST_SLOW_TRAIN s an item, else fast


def job_flags(tiny: dict, **more) -> dict:
    return {**tiny, "data": DATA, "epochs": 4, "ckpt_every": 2, **more}


def torchrun(node_rank: int | None, out: Path, flags: dict, nproc: int = 2,
             rendezvous: str = "static", max_restarts: int = 0) -> list[str]:  # fmt: skip
    """The command each node runs, as trainer.md gives it."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts)]  # fmt: skip
    if rendezvous == "static":
        launcher += ["--node-rank", str(node_rank), "--master-addr", "node0",
                     "--master-port", "29500"]  # fmt: skip
    else:
        launcher += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400",
                     "--rdzv-id", "job"]  # fmt: skip
    return launcher + train_command(out, **flags)[1:]


def start_on(cluster: Cluster, k: int, command: list[str], env: dict | None = None):
    """``command`` started on node ``k``, its output (both streams) captured."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return cluster.popen(k, command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=environment, cwd=REPO)  # fmt: skip


def start_nodes(cluster: Cluster, commands: list[list[str]], env: dict | None = None):
    return [start_on(cluster, k, command, env) for k, command in enumerate(commands)]


def finish(nodes, timeout: float = 180) -> list[tuple[int, str]]:
    outputs = [node.communicate(timeout=timeout)[0] for node in nodes]
    return [(node.returncode, out) for node, out in zip(nodes, outputs, strict=True)]


def until_first_checkpoint(out: Path, timeout: float = 120) -> None:
    checkpoint = out / "checkpoints" / "checkpoint_latest.pth"
    deadline = time.monotonic() + timeout
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert checkpoint.exists(), "the job got as far as its first checkpoint"


def weights(out: Path) -> dict:
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    return {"step": state["step"], **state["model_state_dict"]}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


TINY = {"train_size": 96, "val_size": 37, "input_dim": 8, "hidden_size": 16, "batch_size": 8,
        "epochs": 2, "dtype": "float64", "deterministic": True, "device": "cpu"}  # fmt: skip


def on_one_node(out: Path, nproc: int) -> dict:
    """The reference: the same job on one node."""
    done = run(train_command(out, "--nproc", nproc, **job_flags(TINY)))
    assert done.returncode == 0, done.stderr
    return weights(out)


@pytest.fixture(scope="module")
def one_node_of_four(tmp_path_factory):
    return on_one_node(tmp_path_factory.mktemp("one-node") / "run", 4)


def listed() -> str:
    """The machine's list of network namespaces."""
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def processes_in(networks: set[str]) -> list[int]:
    """The processes on this machine in any of ``networks`` (``net:[inode]``, as
    ``/proc/PID/ns/net`` names a network namespace) that this user may look at."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") in networks:
                found.append(int(pid))
        except OSError:  # gone, or another user's
            pass
    return found


def test_each_node_has_its_host_name_and_address_and_nothing_outlives_the_cluster():
    with Cluster(2) as cluster:
        made, holder = cluster.namespaces(), cluster.user_namespace_pid
        hosts_files = [cluster.hosts_file(k) for k in range(2)]
        networks = {cluster.run(k, ["readlink", "/proc/self/ns/net"]).stdout.strip()
                    for k in range(2)}  # fmt: skip
        assert len(networks) == 2 and all(n.startswith("net:[") for n in networks), networks
        for k in range(2):
            seen = cluster.run(k, ["sh", "-c", "hostname; getent hosts node0 node1; pwd"],
                               cwd=REPO).stdout  # fmt: skip
            assert seen.splitlines()[0] == f"node{k}"
            assert "10.213.0.1" in seen and "10.213.0.2" in seen, seen
            assert seen.splitlines()[-1] == str(REPO), "a command on a node runs where asked"
        server = cluster.popen(1, [sys.executable, "-c", "import socket; s = socket.socket(); "
                                   "s.bind(('node1', 7000)); s.listen(); s.accept()"])  # fmt: skip
        reach = [sys.executable, "-c", "import socket, time\nfor _ in range(50):\n  try:\n"
                 "    socket.create_connection(('node1', 7000), timeout=2); break\n"
                 "  except ConnectionRefusedError: time.sleep(0.1)"]  # fmt: skip
        assert cluster.run(0, reach).returncode == 0, "node 0 reaches node 1 over the bridge"
        server.wait(timeout=10)
        cluster.cut(1)
        cut = [sys.executable, "-c", "import socket; socket.create_connection(('node1', 7000), "
               "timeout=1)"]  # fmt: skip
        assert "timed out" in cluster.run(0, cut).stderr, "a cut link loses packets"
        sleeper = cluster.popen(1, ["sleep", "600"])
        deadline = time.monotonic() + 10  # (until it has entered the node)
        while not processes_in(networks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_in(networks), "a node's processes are seen in its network"
    assert sleeper.poll() is not None and not processes_in(networks), "nothing runs on a node"
    assert not any(name in listed() for name in made)
    assert not any(os.path.exists(path) for path in hosts_files)
    # Without root, the namespaces live as long as the process holding their user namespace.
    assert holder is None or not alive(holder), "the user namespace outlived its cluster"


def test_a_killed_test_run_leaves_no_namespace_behind():
    owner = subprocess.Popen(
        [sys.executable, "-c", "from refddp.testing.cluster import Cluster; import json, time; "
         "c = Cluster(2); print(json.dumps([c.user_namespace_pid or 0, c.namespaces(), "
         "[c.hosts_file(k) for k in range(2)]]), flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    holder, made, hosts_files = json.loads(owner.stdout.readline())
    assert len(made) == 3 and all(os.path.exists(path) for path in hosts_files)
    owner.kill()
    owner.wait()

    def gone() -> bool:
        left = [name for name in made if name in listed()]
        left += [path for path in hosts_files if os.path.exists(path)]
        return not left and not (holder and alive(holder))

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(), "the reaper removes a dead run's cluster: namespaces, hosts files, holder"


@pytest.mark.skipif(cluster_module.in_user_namespace(), reason="made in a user namespace, a "
                    "cluster leaves nothing in the machine's lists")  # fmt: skip
def test_a_new_cluster_removes_what_a_dead_process_left():
    # As a run killed before its reaper could act (the machine rebooted its container, say).
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = f"{PREFIX}{dead.pid}-0-switch"
    subprocess.run(["ip", "netns", "add", left], check=True)
    try:
        with Cluster(1):
            listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        assert left not in listed.stdout
    finally:
        subprocess.run(["ip", "netns", "del", left], capture_output=True)


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_nodes_of_two_end_bit_identical_to_one_node_of_four(tmp_path, tiny, rendezvous,
                                                                one_node_of_four):  # fmt: skip
    # Static: one --out on a disk both nodes share. c10d: node-local --out (each node its own
    # disk): the node that hosts rank 0 holds the checkpoints.
    outs = [tmp_path / "shared"] * 2 if rendezvous == "static" else [tmp_path / "a", tmp_path / "b"]
    with Cluster(2) as cluster:
        commands = [torchrun(k, outs[k], job_flags(tiny), rendezvous=rendezvous) for k in range(2)]
        results = finish(start_nodes(cluster, commands))
    assert [code for code, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    holders = [out for out in dict.fromkeys(outs) if (out / "checkpoints").exists()]
    assert len(holders) == 1, "rank 0 alone writes checkpoints"
    assert_same(weights(holders[0]), one_node_of_four)


def test_a_node_killed_mid_run_ends_the_job_in_seconds_and_the_rerun_is_exact(
    tmp_path, tiny, one_node_of_four
):
    # Two nodes of two ranks: the rerun is bit-exact at 4 ranks too (every run's first step
    # uses DDP's rebuilt bucket layout: trainer.md).
    out = tmp_path / "shared"
    slow = {"REFDDP_TEST_SLOW_TRAIN": "0.1"}
    commands = [torchrun(k, out, job_flags(tiny), nproc=2) for k in range(2)]
    with Cluster(2) as cluster:
        nodes = start_nodes(cluster, commands, slow)
        until_first_checkpoint(out)
        killed = time.monotonic()
        cluster.kill(1)
        code, log = finish(nodes[:1], timeout=120)[0]
        took = time.monotonic() - killed
        nodes[1].wait(timeout=10)
        assert code != 0, log
        assert took < 30, f"node 0 took {took:.0f} s to stop after node 1 died:\n{log[-3000:]}"
        # Either rank of node 0 may see node 1 go first: the other may then see its
        # neighbour stop (and name node 0), as the line says ranks do.
        said = "lost the connection to node1 (10.213.0.2) in a collective"
        assert any(f"error: rank {r}: {said}" in log for r in (0, 1)), log[-3000:]
        assert weights(out)["step"] < 12, "killed mid-run, not after the end"
        results = finish(start_nodes(cluster, commands))
    assert [c for c, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    assert "resumed from" in results[0][1]
    assert_same(weights(out), one_node_of_four)


def test_a_killed_node_started_again_rejoins_under_max_restarts_and_the_job_ends_exact(
    tmp_path, tiny
):
    # c10d rendezvous on node 0 (which survives) and --max-restarts 1: node 0's agent restarts
    # its rank, node 1's new agent joins the next round, and the ranks resume from the last
    # checkpoint. torch's agents share their rendezvous store with the ranks by default, and a
    # surviving agent then never publishes the new round's MASTER_ADDR, which a new agent
    # waits for: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node, as trainer.md says.
    out = tmp_path / "shared"
    env = {"REFDDP_TEST_SLOW_TRAIN": "0.1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    command = torchrun(None, out, job_flags(tiny), nproc=1, rendezvous="c10d", max_restarts=1)
    with Cluster(2) as cluster:
        nodes = start_nodes(cluster, [command, command], env)
        until_first_checkpoint(out)
        cluster.kill(1)
        nodes[1].wait(timeout=10)
        nodes[1] = start_on(cluster, 1, command, env)  # node 1 back, with a new agent
        results = finish(nodes, timeout=120)
    assert [c for c, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    log = results[0][1]
    assert "lost the connection to node1" in log and "resumed from" in log, log[-3000:]
    assert_same(weights(out), on_one_node(tmp_path / "one-node", 2))


def test_a_link_cut_mid_run_ends_every_rank_within_the_timeout_and_the_rerun_is_exact(
    tmp_path, tiny
):
    out = tmp_path / "shared"
    timeout = 8
    slow = {"REFDDP_TEST_SLOW_TRAIN": "0.1"}
    commands = [torchrun(k, out, job_flags(tiny, timeout=timeout), nproc=1) for k in range(2)]
    with Cluster(2) as cluster:
        nodes = start_nodes(cluster, commands, slow)
        until_first_checkpoint(out)
        cut = time.monotonic()
        cluster.cut(1)
        results = finish(nodes, timeout=180)
        took = time.monotonic() - cut
        assert all(code != 0 for code, _ in results), [code for code, _ in results]
        # No reset crosses a pulled cable: each rank waits out --timeout, then writes its
        # stacks and exits (the watchdog); nothing blocks for gloo's own 30-minute default.
        assert took < timeout + 20, f"{took:.0f} s after the cut"
        for rank in range(2):
            stack = (out / "stacks" / f"rank{rank}.txt").read_text()
            # Blocked wherever its next collective was (a step, a checkpoint's agreement).
            assert "Timeout" in stack and "refddp/training/trainer.py" in stack, stack[:2000]
        cluster.restore(1)
        results = finish(start_nodes(cluster, commands))
    assert [c for c, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    assert_same(weights(out), on_one_node(tmp_path / "one-node", 2))



def test_a_slow_node_is_named_with_its_ranks_by_the_straggler_report(tmp_path, tiny):
    # Node 1 runs 30% of the time (its processes stopped and continued in turn): both of its
    # ranks fall behind together, and rank 0's log names them as that node.
    out = tmp_path / "shared"
    commands = [torchrun(k, out, job_flags(tiny, eval_every=1, ckpt_every=0)) for k in range(2)]
    with Cluster(2) as cluster:
        nodes = start_nodes(cluster, commands, {"REFDDP_TEST_SLOW_TRAIN": "0.01"})
        cluster.throttle(1, share=0.3)
        results = finish(nodes)
    assert [code for code, _ in results] == [0, 0], "\n".join(log[-3000:] for _, log in results)
    said = "ranks [2, 3] (node 1) are the slowest at 3 evaluations in a row"
    assert said in results[0][1], results[0][1][-3000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    behind = [r["behind_ranks"] for r in records if "behind_ranks" in r]
    assert behind[-3:] == [[2, 3]] * 3, behind


def test_a_throttle_that_could_not_run_is_refused_with_one_line():
    # time.sleep(NaN) raises in the duty cycle's thread: the node would run at full speed
    # while the test believed it slow.
    with Cluster(1) as cluster:
        for share, period_s in ((0.5, math.nan), (0.5, math.inf), (0.5, 0.0), (0.5, -0.02),
                                (math.nan, 0.02), (1.0, 0.02), (0.0, 0.02)):  # fmt: skip
            with pytest.raises(ValueError, match=r"^throttle: (share|period_s)"):
                cluster.throttle(0, share=share, period_s=period_s)
