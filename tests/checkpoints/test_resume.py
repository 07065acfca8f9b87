"""Resume continues the same run or refuses in one line; stops lose nothing (real CLI)."""

import json
import os
import signal
import socket
import time

import pytest
import torch
import yaml

from refddp.launch.dist import loopback_store
from tests.cli_runs import run, run_nodes, start, torchrun_node_command, train_command
from tests.rank_tasks import config_after_taking_rank0s, fit_signalled_during_save


def assert_same_weights(a, b, rtol=0.0, atol=0.0):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


def history(out):
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def evaluations(out):
    """What an evaluation record states about the run (not how fast this invocation ran)."""
    keys = ("epoch", "step", "train_loss", "val_loss", "val_acc")
    return [{k: h[k] for k in keys} for h in history(out)]


def only_error_line(stderr):
    """The single ``error:`` line of a usage error, which must come before any rank starts."""
    assert "training mlp" not in stderr, "a rank started"
    errors = [line for line in stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), stderr
    return errors[0]


def without_batch_size(flags):
    """A rerun's flags: an explicit --batch-size would fix the per-rank batch, not the run's."""
    return {k: v for k, v in flags.items() if k != "batch_size"}


@pytest.mark.slow  # CLI runs: ~35 s
def test_resume_at_another_world_size_and_accumulation_keeps_the_global_batch(run_cli, tiny):
    straight = run_cli("--nproc", 1, out="straight", **tiny)  # global batch 8: 24 steps
    run_cli("--nproc", 1, "--stop-after", 6, out="hop", **tiny)
    run_cli("--nproc", 2, "--stop-after", 6, out="hop", **without_batch_size(tiny))
    last = run_cli("--nproc", 2, "--grad-accum", 2, out="hop", **without_batch_size(tiny))
    assert "global batch 8 (2 per rank x 2 accumulation)" in last.stderr
    state = last.checkpoint()
    assert (state["step"], state["global_batch"], state["world_size"]) == (24, 8, 2)
    # The same samples in every step: equal up to float64 reduction order.
    assert_same_weights(last.weights(), straight.weights(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--nproc", 2, "--batch-size", 8], "= global batch 16, but the run being resumed"),
        (["--nproc", 3], "global batch 8 does not divide by 3 rank(s) x grad_accum 1"),
        (["--global-batch-size", 16], "global_batch_size: 16 would change the global batch"),
        (["--optimizer", "sgd"], "optimizer: the run being resumed from"),
        (["--depth", 3], "depth: the run being resumed from"),
        (["--seed", 3], "seed: the run being resumed from"),
    ],
    ids=["batch_size", "indivisible", "global_batch_size", "optimizer", "model", "seed"],
)
def test_a_resume_that_would_change_the_run_is_refused_in_one_line(run_cli, tiny, flags, says):
    run_cli("--nproc", 1, "--stop-after", 6, **tiny)
    refused = run_cli(*flags, check=False, **without_batch_size(tiny))
    assert refused.returncode == 2
    line = only_error_line(refused.stderr)
    assert says in line
    if "global batch 16" in says:
        assert "has global batch 8" in line  # both values named


def test_lr_and_weight_decay_changed_on_resume_are_applied_and_recorded(run_cli, tiny):
    flags = {**tiny, "lr_schedule": "constant"}
    run_cli("--stop-after", 5, lr=0.01, **flags)
    resumed = run_cli(lr=0.002, weight_decay=0.1, **flags)
    groups = resumed.checkpoint()["optimizer_state_dict"]["param_groups"]
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(0.002, 0.1)] * len(groups)
    assert resumed.checkpoint()["scheduler_state_dict"]["base_lrs"] == [0.002] * len(groups)
    saved = yaml.safe_load((resumed.out / "config.yaml").read_text())
    assert (saved["lr"], saved["weight_decay"]) == (0.002, 0.1)


@pytest.mark.slow  # CLI runs: ~22 s
@pytest.mark.parametrize("stop_after", [12, 24], ids=["epoch-end", "last-step"])
def test_a_stop_at_an_epoch_end_or_the_last_step_loses_no_evaluation(run_cli, tiny, stop_after):
    straight = run_cli(out="straight", **tiny)  # 12 steps per epoch, 24 in all
    run_cli("--stop-after", stop_after, out="run", **tiny)
    resumed = run_cli(out="run", **tiny)
    assert evaluations(resumed.out) == evaluations(straight.out)
    assert all(h["samples_per_s"] > 0 for h in history(resumed.out))
    assert resumed.checkpoint(BEST)["step"] == straight.checkpoint(BEST)["step"]
    assert_same_weights(resumed.weights(BEST), straight.weights(BEST))


BEST, LATEST = "checkpoint_best.pth", "checkpoint_latest.pth"


@pytest.mark.slow  # CLI runs: ~15 s
def test_a_resume_at_a_lowered_end_evaluates_there_and_one_below_the_step_is_refused(run_cli, tiny):
    # A run stopped at step 6, before any evaluation, resumed with --max-steps 6: it used to
    # end "done" with no evaluation, no history and no metric (and one resumed with
    # --max-steps 4 said "done: step 6").
    flags = {**tiny, "lr_schedule": "constant"}  # so that the end given changes no rate
    straight = run_cli("--max-steps", 6, out="straight", **flags)
    stopped = run_cli("--stop-after", 6, out="run", **flags)
    assert "stopped: step 6, not evaluated yet" in stopped.stderr
    refused = run_cli("--max-steps", 4, out="run", check=False, **flags)
    assert refused.returncode == 2, refused.stderr
    assert ("error: max_steps: 4 ends the run at step 4, but the run resumed from "
            f"{stopped.out / 'checkpoints' / 'checkpoint_latest.pth'} is at step 6") in refused.stderr
    assert "training mlp" not in refused.stderr, "refused before any rank starts"
    assert yaml.safe_load((stopped.out / "config.yaml").read_text())["max_steps"] == 0
    resumed = run_cli("--max-steps", 6, out="run", **flags)
    assert "done: step 6, val_loss" in resumed.stderr
    assert evaluations(resumed.out) == evaluations(straight.out)
    assert_same_weights(resumed.weights(), straight.weights())
    again = run_cli("--max-steps", 6, out="run", **flags)  # evaluated there now: not again
    assert len(history(again.out)) == 1 and "done: step 6, val_loss" in again.stderr


@pytest.mark.slow  # CLI runs: ~22 s
def test_init_from_starts_a_new_run_from_the_weights_only(run_cli, tiny):
    first = run_cli(out="first", **tiny)
    source = first.out / "checkpoints" / "checkpoint_latest.pth"
    fresh = run_cli(out="fresh", **tiny)
    tuned = run_cli("--init-from", source, out="tuned", **tiny)
    assert "initialised from the weights of" in tuned.stderr and "resumed" not in tuned.stderr
    state = tuned.checkpoint()
    assert state["step"] == 24, "a new position"
    adam_steps = {int(s["step"]) for s in state["optimizer_state_dict"]["state"].values()}
    assert adam_steps == {24}, "a fresh optimizer"
    with pytest.raises(AssertionError):
        assert_same_weights(tuned.weights(), fresh.weights())


@pytest.mark.slow  # CLI runs: ~40 s
def test_a_fresh_run_in_a_used_directory_leaves_none_of_the_earlier_runs_checkpoints(run_cli, tiny):
    # An earlier run (steps 4 and 8 saved) in the plain file: a fresh run's first save used
    # to move its latest into checkpoint_previous, so a damaged latest then resumed the
    # earlier run, and its checkpoint_best stayed until the fresh run's first best.
    run_cli("--max-steps", 8, "--eval-every", 4, out="run", **tiny)
    fresh = run_cli("--max-steps", 4, "--eval-every", 4, "--resume", "never", out="run", **tiny)
    checkpoints = fresh.out / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == [BEST, LATEST]
    assert torch.load(checkpoints / BEST, weights_only=True)["step"] == 4
    # Fine-tuning from that best into the same --out, afresh: its first save would remove it.
    refused = run_cli("--init-from", checkpoints / BEST, "--resume", "never", out="run",
                      check=False, **tiny)  # fmt: skip
    assert refused.returncode == 2 and "error: init_from: " in refused.stderr, refused.stderr
    assert (checkpoints / BEST).exists()
    # A fresh run whose first save is no best (a stop before any evaluation): the earlier
    # best goes too.
    run_cli("--max-steps", 8, "--eval-every", 4, out="stopped", **tiny)
    stopped = run_cli("--stop-after", 2, "--resume", "never", out="stopped", **tiny)
    assert sorted(os.listdir(stopped.out / "checkpoints")) == [LATEST]
    (checkpoints / LATEST).write_bytes(b"damaged")
    damaged = run_cli("--max-steps", 8, out="run", check=False, **tiny)
    assert damaged.returncode != 0 and "checkpoint_latest.pth: corrupt" in damaged.stderr
    assert "resumed" not in damaged.stderr, "nothing of the earlier run to fall back to"
    # An earlier run in the dcp format, at a later step (12) than the fresh run's: auto
    # resume takes the newest of every format's latest, which was the earlier run's.
    run_cli("--max-steps", 12, "--eval-every", 4, "--ckpt-format", "dcp", out="dcp", **tiny)
    fresh = run_cli("--max-steps", 4, "--eval-every", 4, "--resume", "never", out="dcp", **tiny)
    assert sorted(os.listdir(fresh.out / "checkpoints")) == [BEST, LATEST], "no dcp one left"
    resumed = run_cli("--max-steps", 8, "--eval-every", 4, out="dcp", **tiny)
    assert "at epoch 0, step 4" in resumed.stderr, "the fresh run's own latest"


def test_init_from_a_checkpoint_of_another_model_is_refused_before_any_rank(run_cli, tiny):
    source = run_cli(out="first", **{**tiny, "hidden_size": 32}).out / "checkpoints"
    refused = run_cli("--init-from", source / "checkpoint_latest.pth", check=False, **tiny)
    assert refused.returncode == 2
    assert "does not fit this model" in only_error_line(refused.stderr)


@pytest.mark.slow  # simulated nodes, four CLI runs: ~50 s
def test_two_nodes_with_node_local_out_resume_from_the_same_state(tmp_path, tiny, spawn):
    # Only rank 0 writes checkpoints, so only node A's --out has one when the job reruns; the
    # rerun leaves the model's width and the learning rate to that checkpoint's config, which
    # node B cannot read: it must run rank 0's config, not a fresh run's defaults.
    outs = [tmp_path / "node-a", tmp_path / "node-b"]
    job = {**tiny, "lr": 0.02}
    rerun = {k: v for k, v in job.items() if k not in ("hidden_size", "lr")}
    for extra, flags in ((["--stop-after", 5], job), ([], rerun)):
        rendezvous = loopback_store()
        commands = [torchrun_node_command(rendezvous.port, 2, out, *extra, **flags)
                    for out in outs]  # fmt: skip
        nodes = run_nodes(commands)
        assert [code for code, _ in nodes] == [0, 0], "\n".join(log for _, log in nodes)
    told = "rank 1 runs rank 0's config, which differs from the one resolved here in "
    assert told + "hidden_size=16 (here 128), lr=0.02 (here 0.003)" in nodes[1][1], nodes[1][1]
    assert not (outs[1] / "checkpoints").exists()
    resumed = torch.load(outs[0] / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    straight = run(train_command(tmp_path / "straight", "--nproc", 2, **job))
    assert straight.returncode == 0, straight.stderr
    expected = torch.load(tmp_path / "straight" / "checkpoints" / "checkpoint_latest.pth",
                          weights_only=True)  # fmt: skip
    assert resumed["step"] == expected["step"] == 12
    assert_same_weights(resumed["model_state_dict"], expected["model_state_dict"])


def test_nodes_given_different_flags_stop_in_one_line_before_training(tmp_path, tiny, spawn):
    rendezvous = loopback_store()
    nodes = run_nodes([torchrun_node_command(rendezvous.port, 2, tmp_path / name, **tiny, lr=lr)
                       for name, lr in (("node-a", 0.02), ("node-b", 0.01))])  # fmt: skip
    # Each rank exits 2 (a usage error); plain torchrun itself then exits 1 for any failed rank.
    assert [code for code, _ in nodes] == [1, 1], "\n".join(log for _, log in nodes)
    assert all("(exitcode: 2)" in log for _, log in nodes), "\n".join(log for _, log in nodes)
    said = "config: the ranks' configs differ (lr: rank 0 runs 0.02, rank 1 0.01): give every node"
    assert said in nodes[0][1] and said in nodes[1][1], "\n".join(log for _, log in nodes)
    assert not (tmp_path / "node-a" / "checkpoints").exists(), "nothing was trained"


CHECKPOINT_MODEL = "tests.user_code:killed_mlp"  # named by rank 0's checkpoint, say


@pytest.mark.parametrize(
    ("fields", "given", "outcome"),
    [
        # rank 1's command left lr and the model out: rank 0's values (from its checkpoint)
        ([{"lr": 0.02, "hidden_size": 16}, {}], [[], []], "rank 0's"),
        ([{"lr": 0.02}, {"lr": 0.01}], [["lr"], ["lr"]], "lr: rank 0 runs 0.02, rank 1 0.01"),
        ([{"timeout": 900.0}, {}], [[], []], "timeout: rank 0 runs 900.0, rank 1 300.0"),
        ([{"model": CHECKPOINT_MODEL}, {}], [["model"], []],
         f"rank 1: model: refused to import '{CHECKPOINT_MODEL}'"),
        ([{"model": CHECKPOINT_MODEL}, {"trust_checkpoint_code": True}], [["model"], []],
         "rank 0's"),
    ],
)
def test_a_rank_takes_rank_0s_config_only_where_its_command_is_silent(spawn, fields, given,
                                                                        outcome):
    results = spawn(config_after_taking_rank0s, fields, given, world_size=2)
    if outcome == "rank 0's":
        assert results[1] == results[0] and results[0]["lr"] == fields[0].get("lr", 3e-3)
        assert results[0]["model"] == fields[0].get("model", "mlp")
    else:  # every rank refuses, in the same line
        assert results[0] == results[1] and results[0].startswith("config: the ranks' configs")
        assert outcome in results[0], results[0]


@pytest.mark.slow  # CLI runs: ~25 s
def test_ranks_that_find_different_checkpoints_stop_in_one_line(tmp_path, tiny, spawn):
    outs = [tmp_path / "node-a", tmp_path / "node-b"]
    rendezvous = loopback_store()  # node B starts first: rank 0, so its --out gets the checkpoint
    nodes = run_nodes([torchrun_node_command(rendezvous.port, 2, out, "--stop-after", 5, **tiny)
                       for out in reversed(outs)])  # fmt: skip
    assert [code for code, _ in nodes] == [0, 0], "\n".join(log for _, log in nodes)
    rendezvous = loopback_store()  # now node A is rank 0 and finds nothing
    nodes = run_nodes([torchrun_node_command(rendezvous.port, 2, out, **tiny) for out in outs])
    assert all(code != 0 for code, _ in nodes)
    said = nodes[0][1]
    assert f"rank 0: none in {outs[0]}; rank 1: step 5 in {outs[1]}" in said, said
    assert not (outs[0] / "checkpoints").exists(), "nothing was trained from scratch"


@pytest.mark.slow  # a long evaluation, twice: ~40 s
@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_during_a_long_evaluation_stops_promptly_and_the_rerun_evaluates(
    tmp_path, tiny, spawn, nproc
):
    flags = {**tiny, "data": "tests.user_code:slow_eval_datasets", "val_size": 2000}
    out, marker = tmp_path / "run", tmp_path / "evaluating"
    # 2000 validation items at 50 ms: an evaluation of 100 s / nproc, far past the 30 s the
    # launcher grants ranks after a signal.
    proc = start(train_command(out, "--nproc", nproc, **flags),
                 env={"REFDDP_TEST_SLOW_EVAL": str(tmp_path)})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "no evaluation started"
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 20, f"the evaluation must not run to its end:\n{stderr}"
    assert proc.returncode == 143, stderr
    state = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert (state["step"], state["eval_pending"]) == (24 // nproc // 2, True), stderr
    assert f"stopped at step {state['step']} (SIGTERM)" in stderr
    assert not (out / "history.jsonl").exists() or not history(out)

    rerun = run(train_command(out, "--nproc", nproc, **flags))
    straight = run(train_command(tmp_path / "straight", "--nproc", nproc, **flags))
    assert rerun.returncode == straight.returncode == 0, rerun.stderr + straight.stderr
    assert evaluations(out) == evaluations(tmp_path / "straight")
    best = [torch.load(d / "checkpoints" / BEST, weights_only=True)["step"]
            for d in (out, tmp_path / "straight")]  # fmt: skip
    assert best[0] == best[1]


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGUSR1, 138)]
)
def test_one_process_stopped_by_a_signal_exits_128_plus_n_and_says_stopped(
    tmp_path, tiny, spawn, sig, code
):
    out = tmp_path / "run"
    proc = start(train_command(out, "--nproc", 1, "--ckpt-every", 50,
                               **{**tiny, "epochs": 400}))  # fmt: skip
    try:
        latest = out / "checkpoints" / "checkpoint_latest.pth"
        deadline = time.monotonic() + 120
        while not latest.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    step = torch.load(latest, weights_only=True)["step"]
    assert f"stopped at step {step} ({sig.name})" in stderr
    assert f"stopped: step {step}" in stderr and "done:" not in stderr


def test_a_stop_requested_during_a_save_ends_the_run_at_that_save(spawn, tmp_path):
    results = spawn(fit_signalled_during_save, str(tmp_path), save_step=4, ckpt_every=4)
    assert [(r["step"], r["stopped_by"]) for r in results] == [(4, signal.SIGTERM)] * 2
    latest = torch.load(tmp_path / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert latest["step"] == 4


@pytest.mark.parametrize("nproc", [1, 2], ids=["one-process", "launcher"])
def test_a_second_run_on_a_run_directory_in_use_is_refused_and_the_first_goes_on(
    tmp_path, tiny, spawn, nproc
):
    # Two runs on one --out resumed from each other's checkpoints and wrote one history
    # between them; the first died on a stack file the second had replaced.
    out = tmp_path / "run"
    flags = {**tiny, "epochs": 400}
    first = start(train_command(out, "--nproc", nproc, "--no-progress", **flags))
    try:
        lock = out / ".refddp.lock"
        deadline = time.monotonic() + 120
        while not (out / "history.jsonl").exists():  # training, past its first evaluation
            assert time.monotonic() < deadline and first.poll() is None, "the first run ended"
            time.sleep(0.05)
        second = run(train_command(out, "--nproc", nproc, "--no-progress", **flags))
        assert first.poll() is None, "the first run must go on"
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=60)
    finally:
        first.kill()
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines() == [
        f"error: out: {out} is in use by another training run (pid {first.pid} on "
        f"{socket.gethostname()}); wait for it to end, stop it, or give another --out"
    ]
    assert "stopped at step" in stderr, stderr
    steps = [h["step"] for h in history(out)]
    assert steps == sorted(set(steps)), "one run's history"
    assert lock.read_text().strip() == f"pid {first.pid} on {socket.gethostname()}"
    rerun = run(train_command(out, "--nproc", nproc, "--stop-after", 1, "--no-progress", **flags))
    assert rerun.returncode == 0, rerun.stderr  # the first run's lock went with it
