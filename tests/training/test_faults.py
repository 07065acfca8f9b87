"""Faults and signals through the real CLI: nothing lost, nothing hangs, no process left behind."""

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.cli_runs import error_lines, run, start, train_command

TINY = [
    "--train-size",
    "96",
    "--val-size",
    "37",
    "--input-dim",
    "8",
    "--hidden-size",
    "16",
    "--batch-size",
    "8",
    "--dtype",
    "float64",
    "--deterministic",
    "--device",  # the CPU suite runs on CPU on GPU machines too
    "cpu",
]


def cli(out, *args):
    return train_command(out, *TINY, *args)


def wait_for(predicate, deadline_s, what):
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def processes_mentioning(text):
    """Live processes whose command line or environment mentions ``text`` (e.g. a run dir)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            blob = (
                Path(f"/proc/{pid}/cmdline").read_bytes()
                + Path(f"/proc/{pid}/environ").read_bytes()
            )
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in blob and state != "Z" and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def rank_pids(launcher_pid):
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == launcher_pid:
            children.append(int(pid))
    return children


def weights(out):
    path = Path(out) / "checkpoints" / "checkpoint_latest.pth"
    return torch.load(path, weights_only=True)["model_state_dict"]


def assert_bit_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture
def no_leftovers(tmp_path):
    yield
    wait_for(
        lambda: not processes_mentioning(str(tmp_path)), 20, "every process of the run to exit"
    )


@pytest.mark.slow  # an elastic restart and a second run: ~35 s
def test_sigkilled_rank_is_restarted_and_the_run_ends_bit_identical(tmp_path, spawn, no_leftovers):
    flags = ["--nproc", 2, "--epochs", 3, "--ckpt-every", 4]
    straight = run(cli(tmp_path / "straight", *flags))
    assert straight.returncode == 0, straight.stderr
    killed = run(
        cli(
            tmp_path / "killed",
            *flags,
            "--max-restarts",
            1,
            "--model",
            "tests.user_code:killed_mlp",
        ),
        env={"REFDDP_TEST_KILL_AT": "11"},
    )
    assert killed.returncode == 0, killed.stderr
    # Killed during step 11: the restart resumes from the checkpoint at step 8 (<= ckpt_every lost).
    assert "resumed from" in killed.stderr and "at epoch 1, step 8" in killed.stderr
    # killed_mlp is mlp plus a hook: same parameters, so the runs must match bit for bit.
    assert_bit_identical(weights(tmp_path / "killed"), weights(tmp_path / "straight"))


def test_sigkill_without_restarts_fails_naming_the_rank(tmp_path, spawn, no_leftovers):
    done = run(
        cli(tmp_path / "run", "--nproc", 2, "--model", "tests.user_code:killed_mlp"),
        env={"REFDDP_TEST_KILL_AT": "3"},
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training failed: ") and "rank 1 killed by SIGKILL" in last


@pytest.mark.slow  # three 2,000-step runs through the launcher: 90-110 s
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_the_launcher_checkpoints_and_a_rerun_finishes_identically(
    tmp_path, spawn, no_leftovers, sig, code
):
    flags = [
        "--nproc",
        2,
        "--epochs",
        400,
        "--max-steps",
        2000,
        "--ckpt-every",
        50,
        "--lr-schedule",
        "constant",
    ]
    proc = start(cli(tmp_path / "run", *flags))
    latest = tmp_path / "run" / "checkpoints" / "checkpoint_latest.pth"
    wait_for(latest.exists, 120, "the first checkpoint")
    sent = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30, "the job must stop within seconds"
    assert proc.returncode == code, stderr
    state = torch.load(latest, weights_only=True)
    assert 0 < state["step"] < 2000
    assert f"stopped at step {state['step']} ({sig.name})" in stderr
    assert "rerun the same command to resume" in stderr

    rerun = run(cli(tmp_path / "run", *flags))
    assert rerun.returncode == 0, rerun.stderr
    straight = run(cli(tmp_path / "straight", *flags))
    assert_bit_identical(weights(tmp_path / "run"), weights(tmp_path / "straight"))
    assert straight.returncode == 0


def test_sigusr1_to_the_launcher_stops_every_rank_with_a_checkpoint_exit_138(
    tmp_path, spawn, no_leftovers
):
    # SLURM's signal before a time limit (sbatch --signal=USR1@SECONDS), sent to a job step
    # that runs the launcher: torch's agent alone would die of it. (The rerun is the same as
    # after SIGTERM, above.)
    proc = start(cli(tmp_path / "run", "--nproc", 2, "--epochs", 400, "--ckpt-every", 50,
                     "--log-all-ranks"))  # fmt: skip
    latest = tmp_path / "run" / "checkpoints" / "checkpoint_latest.pth"
    wait_for(latest.exists, 120, "the first checkpoint")
    proc.send_signal(signal.SIGUSR1)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 138, stderr
    step = torch.load(latest, weights_only=True)["step"]
    for rank in (0, 1):
        assert f"[rank {rank}] " in stderr and f"stopped at step {step} (SIGUSR1)" in stderr
    assert stderr.count(f"stopped at step {step} (SIGUSR1)") == 2, stderr
    assert stderr.strip().splitlines()[-1] == (
        "stopped by SIGUSR1; rerun the same command to resume"
    )


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, spawn, no_leftovers):
    proc = start(cli(tmp_path / "run", "--nproc", 2, "--epochs", 400, "--ckpt-every", 50))
    latest = tmp_path / "run" / "checkpoints" / "checkpoint_latest.pth"
    wait_for(latest.exists, 120, "the first checkpoint")
    ranks = rank_pids(proc.pid)
    assert len(ranks) == 2
    os.kill(ranks[-1], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr  # a clean, agreed stop: nothing failed
    step = torch.load(latest, weights_only=True)["step"]
    assert f"stopped at step {step} (SIGTERM)" in stderr


def test_hung_data_loader_writes_every_rank_stack_and_fails(tmp_path, spawn, no_leftovers):
    started = time.monotonic()
    done = run(
        cli(
            tmp_path / "run",
            "--nproc",
            2,
            "--timeout",
            10,  # (4 s fired on torch 2.5 under load while DDP's construction imported dynamo)
            "--data",
            "tests.user_code:stuck_datasets",
        )
    )
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    stacks = tmp_path / "run" / "stacks"
    assert f"stacks of hung ranks in {stacks}/" in done.stderr.strip().splitlines()[-1]
    stuck = (stacks / "rank1.txt").read_text()
    assert "in __getitem__" in stuck and "user_code.py" in stuck
    waiting = (stacks / "rank0.txt").read_text()
    assert "in _fit" in waiting, "rank 0 was blocked waiting for rank 1"


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, spawn, no_leftovers):
    out = tmp_path / "run"
    first = run(cli(out, "--epochs", 2, "--ckpt-every", 5, "--nproc", 2))
    assert first.returncode == 0, first.stderr
    latest = out / "checkpoints" / "checkpoint_latest.pth"
    latest.write_bytes(latest.read_bytes()[:1000])  # a crash mid-copy, say
    rerun = run(cli(out, "--epochs", 3, "--ckpt-every", 5, "--nproc", 2))
    assert rerun.returncode == 0, rerun.stderr
    assert "checkpoint_latest.pth: corrupt or truncated checkpoint" in rerun.stderr
    assert "resuming from the older" in rerun.stderr and "checkpoint_previous.pth" in rerun.stderr
    assert rerun.stderr.count("resuming from the older") == 1, "said once, not by every rank"


def test_nonfinite_loss_with_stop_policy_exits_with_one_line(tmp_path, spawn, no_leftovers):
    done = run(
        cli(
            tmp_path / "run",
            "--nproc",
            2,
            "--on-nonfinite",
            "stop",
            "--data",
            "tests.user_code:exploding_datasets",
        )
    )
    assert done.returncode == 1
    errors = error_lines(done.stderr)
    assert len(errors) == 1, errors  # the stop every rank agreed on, once, from the launcher
    assert re.match(r"error: step \d+: non-finite loss on [12] of 2 rank\(s\); stopping every "
                    r"rank \(on_nonfinite=stop\)$", errors[0]), errors
    history = tmp_path / "run" / "history.jsonl"
    assert not history.exists() or all(json.loads(ln) for ln in history.read_text().splitlines())


def listening_addresses(pids):
    """The local addresses of TCP sockets in LISTEN state held open by ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                host = address.split(":")[0]
                if width == 8:
                    host = ".".join(str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0))
                found.append(host)
    return found


def test_a_local_run_listens_on_loopback_only(tmp_path, spawn, no_leftovers):
    assert_listens_on_loopback_only(tmp_path / "run", [])


def lan_address():
    """An IPv4 address of this machine that is not loopback, or None."""
    import subprocess

    shown = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True
    ).stdout.split()
    return shown[shown.index("inet") + 1].split("/")[0] if "inet" in shown else None


def test_a_local_run_listens_on_loopback_even_if_the_hostname_resolves_to_the_lan(
    tmp_path, spawn, no_leftovers
):
    # Gloo binds the address the host name resolves to. Give the run a host name that resolves
    # to this machine's LAN address (private UTS and mount namespaces, a private /etc/hosts),
    # so the test cannot pass merely because this machine's name maps to 127.0.0.1.
    address = lan_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{address} refddp-lan-host\n")
    private = ["unshare", "--uts", "--mount", "sh", "-c",
               'mount --bind "$0" /etc/hosts && hostname refddp-lan-host && exec "$@"', str(hosts)]  # fmt: skip
    import subprocess

    if subprocess.run([*private, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create private UTS and mount namespaces here (needs root)")
    assert_listens_on_loopback_only(tmp_path / "run", private)


def assert_listens_on_loopback_only(out, prefix):
    """Start a 2-rank run (behind ``prefix``), and once it trains, check every listener."""
    proc = start([*prefix, *cli(out, "--nproc", 2, "--epochs", 400, "--ckpt-every", 50)])
    try:
        wait_for(
            (out / "checkpoints" / "checkpoint_latest.pth").exists,
            120,
            "training to be under way",
        )
        addresses = listening_addresses([proc.pid, *rank_pids(proc.pid)])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert len(addresses) >= 3, "rendezvous store, ranks' store and gloo listeners"
    assert set(addresses) == {"127.0.0.1"}, addresses


def gloo_setting_and_listeners():
    """On a pool rank: the gloo interface setting and this process's listening addresses."""
    return os.environ.get("GLOO_SOCKET_IFNAME"), listening_addresses([os.getpid()])


def test_the_harness_pools_pin_gloo_to_loopback(spawn):
    from refddp.launch.dist import loopback_interface

    for interface, addresses in spawn(gloo_setting_and_listeners):
        assert interface == loopback_interface()  # set before the pool's group was created
        assert addresses and set(addresses) == {"127.0.0.1"}, addresses
