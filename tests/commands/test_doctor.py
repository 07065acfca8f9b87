"""`python -m refddp.doctor`: every rank reports in, a missing rank is named, bad shards flagged."""

import json
import os
import subprocess
import sys

import pytest

from refddp.doctor import format_table, main
from refddp.testing import RankFailure, RankTimeout
from tests.cli_runs import REPO
from tests.rank_tasks import doctor_check
from tests.torch_features import FSDP


def test_every_rank_reports_in_with_timings_and_shards(spawn):
    results = spawn(doctor_check)
    assert [r["rank"] for r in results] == [0, 1]
    report = results[0]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert len({r["pid"] for r in report["ranks"]}) == 2
    assert all(row["latency_ms"] > 0 for row in report["all_reduce"])
    assert report["shards"]["val_samples_per_rank"] == [19, 18]
    assert report["problems"] == []
    timed = report["step_times"]
    assert timed["steps"] == 5 and [r["rank"] for r in timed["per_rank"]] == [0, 1]
    assert all(r["step_ms"] >= r["compute_ms"] > 0 for r in timed["per_rank"])
    assert timed["slowest_rank"] in (0, 1) and "straggler_lag_s" in timed
    table = format_table(report)
    assert "OK: no problems found" in table and "all_reduce (float32)" in table
    assert "training steps (5 timed after one to warm up" in table and "  rank 1: step " in table


def test_a_rank_that_never_arrives_is_named_not_waited_for(spawn):
    # A 0.5 s barrier fails well before the harness's own one-sided-hang report (2 s), which
    # would otherwise race it (seen once under -n 2).
    with pytest.raises(RankFailure) as info:
        spawn(doctor_check, 1, barrier_s=0.5, timeout=60)
    assert not isinstance(info.value, RankTimeout)
    assert "DoctorFailure: barrier failed" in info.value.failures[0]
    assert "Ranks 1 failed to pass monitoredBarrier in 500 ms" in info.value.failures[0]


def test_empty_shards_are_a_problem(spawn):
    report = spawn(doctor_check, train_size=5, val_size=1, batch_size=4)[0]
    assert any("do not fill one global batch of 8" in p for p in report["problems"])
    assert any("leaves 1 rank(s) empty" in p for p in report["problems"])


@pytest.mark.parametrize("flags, line", [
    (["--barrier-timeout", "nan"], "--barrier-timeout: expected a number of seconds > 0, at most a week, got nan"),
    (["--barrier-timeout", "0"], "--barrier-timeout: expected a number of seconds > 0, at most a week, got 0.0"),
    (["--barrier-timeout", "inf"], "--barrier-timeout: expected a number of seconds > 0, at most a week, got inf"),
    (["--repeats", "0"], "--repeats: must be >= 1, got 0"),
    (["--steps", "-1"], "--steps: must be >= 0, got -1"),
    (["--nproc", "-1"], "--nproc: must be >= 0, got -1"),
])  # fmt: skip
def test_the_doctors_own_bad_options_are_one_line_and_exit_2(capsys, flags, line):
    # Refused before any rank starts (a NaN barrier timeout failed every rank in a traceback).
    assert main(flags) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


@pytest.mark.slow  # the doctor's own 2-rank job: ~23 s
def test_cli_prints_json_and_exits_nonzero_on_problems(spawn):
    ok = subprocess.run(
        # --device cpu: the CPU suite runs on CPU on GPU machines too
        [sys.executable, "-m", "refddp.doctor", "--nproc", "2", "--json", "--repeats", "2",
         "--device", "cpu"],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["world_size"] == 2
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "refddp.doctor",
            "--nproc",
            "2",
            "--repeats",
            "2",
            "--train-size",
            "3",
            "--batch-size",
            "2",
            "--device",
            "cpu",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "error: doctor failed: " in bad.stderr and "training" not in bad.stderr
    assert "PROBLEM: the 3 training samples do not fill one global batch of 4" in bad.stdout


SLOW_RANK0_TEARDOWN = """
import os
if os.environ.get("RANK") == "0" and "LOCAL_RANK" in os.environ:  # rank 0 of the doctor
    import time
    import refddp.launch.dist
    leave = refddp.launch.dist.teardown
    def slow_teardown(*args, **kwargs):
        time.sleep(3)
        leave(*args, **kwargs)
    refddp.launch.dist.teardown = slow_teardown
"""


def test_the_report_is_printed_before_any_rank_leaves(tmp_path):
    # Rank 1 exits 1 (problems found) while rank 0 is still leaving the group; the launcher
    # then stops rank 0, so rank 0 must have printed the report before the ranks parted.
    (tmp_path / "sitecustomize.py").write_text(SLOW_RANK0_TEARDOWN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    bad = subprocess.run(
        [sys.executable, "-m", "refddp.doctor", "--nproc", "2", "--repeats", "2",
         "--train-size", "3", "--batch-size", "2", "--device", "cpu"],  # fmt: skip
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,  # fmt: skip
    )
    assert bad.returncode == 1, bad.stderr
    assert "PROBLEM: the 3 training samples do not fill one global batch of 4" in bad.stdout


MIXED_BACKEND_DOCTOR = """
import json, torch.distributed as dist
from refddp.doctor import check
from tests.rank_tasks import tiny_config
# A default group whose backend is not plain gloo, as on GPUs ('cpu:gloo,cuda:nccl', 'nccl'):
# monitored_barrier refuses it, so the roll call must run on a gloo side group.
dist.init_process_group("cpu:gloo", store=dist.HashStore(), rank=0, world_size=1)
print(json.dumps(check(tiny_config("unused"), barrier_timeout_s=2.0, repeats=2)["problems"]))
dist.destroy_process_group()  # ours: leaving with gloo's threads running can abort the exit
"""


def test_the_roll_call_runs_on_a_gloo_side_group_when_the_backend_is_not_gloo(spawn):
    done = subprocess.run(
        [sys.executable, "-c", MIXED_BACKEND_DOCTOR],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "ValueError" not in done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize("strategy", ["ddp", FSDP])
def test_the_doctor_reports_the_strategy_and_each_ranks_share_of_the_model(spawn, strategy):
    model = spawn(doctor_check, strategy=strategy, world_size=2)[0]["model"]
    assert model["strategy"] == strategy
    total, per_rank = model["parameters"], model["parameters_per_rank"]
    if strategy == "ddp":
        assert per_rank == [total, total]  # replicated
    else:
        assert sum(per_rank) == total and max(per_rank) - min(per_rank) <= 0.1 * total  # halves
