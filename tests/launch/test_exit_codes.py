"""Exit codes and one-line errors of the real CLI for failures that happen after ranks start."""


import os
import subprocess

import pytest
import torch
import yaml

from refddp.training.parallel import unused_parameters_line
from tests.cli_runs import error_lines, run, train_command
from tests.torch_features import needs_fsdp2


def test_a_sigkilled_rank_is_named_and_no_empty_stack_file_is_reported(run_cli, tiny):
    done = run_cli(
        "--nproc", 2, model="tests.user_code:killed_mlp", check=False,
        env={"REFDDP_TEST_KILL_AT": "3"}, **tiny,
    )  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    # Rank 0, which the launcher then ended (SIGTERM), is not named as a cause.
    assert last == "error: training failed: rank 1 killed by SIGKILL; see the ranks' output above"


def test_a_config_error_on_one_rank_only_is_printed_naming_the_rank(run_cli, tiny):
    done = run_cli(
        "--nproc", 2, data="tests.user_code:datasets_missing_on_rank_1", check=False, **tiny
    )
    assert done.returncode == 2, done.stderr
    assert error_lines(done.stderr) == [
        "error: data: file not found: /node-local/train.pt (rank 1)"
    ], done.stderr


def test_parameters_without_a_gradient_are_one_line_naming_them_and_the_flag(run_cli, tiny):
    # DDP's own error is a 20-line traceback on every rank, on the step after the one that
    # left the parameters out.
    model = "tests.user_code:mlp_with_an_unused_head"
    done = run_cli("--nproc", 2, model=model, check=False, **tiny)
    assert done.returncode == 2, done.stderr
    [line] = error_lines(done.stderr)
    said = ("error: find_unused_parameters: parameters of the model got no gradient in a step "
            "(unused_head.weight, unused_head.bias), which DDP must be told of: run with "
            "--find-unused-parameters, or leave them out of the model (or set requires_grad=False "
            "on them)")  # fmt: skip
    # (Each rank finds it; one the launcher's agent ends first has not recorded it yet.)
    assert line in (f"{said} (ranks 0, 1)", f"{said} (rank 0)", f"{said} (rank 1)"), line
    assert run_cli("--nproc", 2, "--find-unused-parameters", model=model, out="with_the_flag",
                   **tiny).returncode == 0  # fmt: skip


DDP_UNUSED = ("Expected to have finished reduction in the prior iteration before starting a new "
              "one. This error indicates that your module has parameters that were not used in "
              "producing loss.\n")


def test_the_unused_parameters_line_takes_ddps_own_names_where_it_gives_them():
    # Under TORCH_DISTRIBUTED_DEBUG=INFO or DETAIL, DDP names them: those names, not indices.
    model = torch.nn.Linear(2, 2)
    named = (DDP_UNUSED + "Parameters which did not receive grad for rank 1: head.weight, "
             "head.bias\nParameter indices which did not receive grad for rank 1: 0 1\n")  # fmt: skip
    assert "no gradient in a step (head.weight, head.bias), " in unused_parameters_line(
        RuntimeError(named), model)
    indexed = DDP_UNUSED + "Parameter indices which did not receive grad for rank 0: 1\n"
    assert "no gradient in a step (bias), " in unused_parameters_line(RuntimeError(indexed), model)
    assert unused_parameters_line(RuntimeError("another error"), model) is None


def no_space_left(path):
    """``path`` becomes a file every write to fails with ENOSPC: a full disk, without root."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/full")


def test_a_full_disk_while_writing_history_exits_1_naming_the_file(run_cli, tiny, tmp_path):
    history = tmp_path / "run" / "history.jsonl"
    no_space_left(history)
    done = run_cli("--nproc", 2, check=False, **tiny)
    assert done.returncode == 1, done.stderr
    errors = error_lines(done.stderr)
    assert errors[0] == f"error: cannot write {history}: No space left on device", done.stderr
    assert errors[1].startswith("error: training failed: ")  # the launcher's summary
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("task, name", [("eval", "eval.json"), ("predict", "predictions.pt")])
def test_a_full_disk_while_writing_results_exits_1_naming_the_file(run_cli, tiny, task, name):
    trained = run_cli("--nproc", 1, **tiny)
    no_space_left(trained.out / name)
    done = run_cli("--task", task, "--nproc", 1, check=False)
    assert done.returncode == 1, done.stderr
    assert error_lines(done.stderr) == [
        f"error: cannot write {trained.out / name}: No space left on device"
    ], done.stderr
    assert "Traceback" not in done.stderr


def test_a_full_disk_while_saving_a_checkpoint_exits_1_naming_the_file(tmp_path, tiny, spawn):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    # A real full file system: a 4 KiB tmpfs on the checkpoint directory, in a private mount
    # namespace (root only; the mount disappears with the process).
    mount = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=4k tmpfs "$0" && exec "$@"']
    probe = subprocess.run([*mount, str(checkpoints), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr!r}")
    cmd = [*mount, str(checkpoints), *train_command(tmp_path / "run", "--nproc", 2, **tiny)]
    done = run(cmd)
    assert done.returncode == 1, done.stderr
    errors = error_lines(done.stderr)
    latest = checkpoints / "checkpoint_latest.pth"
    assert errors[0] == f"error: cannot write checkpoint {latest}: No space left on device", done.stderr
    assert "Traceback" not in done.stderr


def test_a_failed_link_of_the_best_checkpoint_exits_1_naming_the_file(run_cli, tiny, tmp_path):
    best = tmp_path / "run" / "checkpoints" / "checkpoint_best.pth"
    (best / "in_the_way").mkdir(parents=True)  # a directory where the file must go
    done = run_cli("--nproc", 1, check=False, **tiny)
    assert done.returncode == 1, done.stderr
    assert error_lines(done.stderr) == [
        f"error: cannot write checkpoint {best}: Is a directory"
    ], done.stderr


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_temporary_files_of_writers_killed_mid_write_are_removed_by_the_next_save(
    run_cli, tiny, tmp_path
):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    dead = dead_pid()
    stale = [f".checkpoint_latest.pth.tmp-{dead}", f"checkpoint_best.pth.tmp-{dead}"]
    live = f".checkpoint_latest.pth.tmp-{os.getpid()}"  # a writer that is still running
    for name in [*stale, live]:
        (checkpoints / name).write_bytes(b"PK\x03\x04 half a checkpoint")
    run_cli("--nproc", 1, "--stop-after", 2, **tiny)
    left = sorted(p.name for p in checkpoints.iterdir())
    assert left == sorted([live, "checkpoint_latest.pth"]), left


def test_yaml_numbers_written_with_an_exponent_load(run_cli, tiny, tmp_path):
    config = tmp_path / "train.yaml"
    # PyYAML reads 1e-3 (no dot) as the string '1e-3': these are the numbers people write.
    config.write_text("lr: 1e-3\nweight_decay: 5E-4\nmax_steps: 1e1\n")
    done = run_cli("--config", config, "--nproc", 1, **tiny)
    saved = yaml.safe_load((done.out / "config.yaml").read_text())
    assert (saved["lr"], saved["weight_decay"], saved["max_steps"]) == (0.001, 0.0005, 10)
    assert "done: step 10" in done.stderr


@pytest.mark.slow  # a launcher run, and a SIGKILL and restart: 20-45 s each
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("restart", [False, True], ids=["no_restart", "sigkill_and_restart"])
def test_a_run_that_finishes_training_exits_0(run_cli, tiny, nproc, restart):
    """After a stop, and after an elastic restart, a finished run ends with exit code 0 (a
    native thread outliving the interpreter once turned a finished run into SIGABRT)."""
    flags = {**tiny, "model": "tests.user_code:killed_mlp", "ckpt_every": 4}
    stopped = run_cli("--nproc", nproc, "--stop-after", 2, check=False, **flags)
    assert stopped.returncode == 0, stopped.stderr
    kill = {"REFDDP_TEST_KILL_AT": "5", "REFDDP_TEST_KILL_RANK": str(nproc - 1)}
    done = run_cli(
        "--nproc", nproc, "--max-restarts", int(restart), check=False,
        env=kill if restart else None, **flags,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr
    steps = 24 // nproc
    assert f"done: step {steps}" in done.stderr
    # Resumed after the stop, and once more after the kill (during step 7) if restarted.
    assert done.stderr.count("resumed from") == 1 + restart, done.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc/self/task")
@pytest.mark.parametrize("nproc, strategy", [(1, "ddp"), (2, "ddp"),
                                             pytest.param(2, "fsdp", marks=[pytest.mark.slow, needs_fsdp2])])
def test_no_gloo_thread_outlives_the_process_group_after_a_run(run_cli, tiny, nproc, strategy,
                                                               tmp_path):
    """The root of the exit abort: after teardown, no gloo thread may be left running into
    interpreter shutdown. Exit handlers run after teardown; the model's handler lists the
    rank's native threads there."""
    flags = {**tiny, "model": "tests.user_code:mlp_reporting_native_threads_at_exit"}
    env = {"REFDDP_TEST_THREADS_DIR": str(tmp_path)}
    run_cli("--nproc", nproc, "--strategy", strategy, env=env, **flags)
    for rank in range(nproc):
        threads = (tmp_path / f"rank{rank}.txt").read_text().split()
        assert "python" in threads  # the report ran
        assert not [t for t in threads if "gloo" in t], f"rank {rank}: {threads}"


def test_a_dataset_that_does_not_pickle_under_an_explicit_worker_start_exits_2_in_one_line(
    run_cli, tiny
):
    done = run_cli("--nproc", 2, "--data", "tests.user_code:unpicklable_datasets",
                   "--num-workers", 1, "--worker-start", "spawn", check=False, **tiny)  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = error_lines(done.stderr)
    assert errors and all(e == errors[0] for e in errors), done.stderr  # the ranks say one line
    assert "worker_start: spawn starts each loader worker" in errors[0], errors
    assert "Traceback" not in done.stderr and "PicklingError" not in done.stderr, done.stderr
