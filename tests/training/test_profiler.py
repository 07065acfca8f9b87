"""``--profile START:END``: a torch.profiler trace of exactly those steps on every rank."""

import json

from tests.cli_runs import run, train_command

JOB = ["--nproc", 2, "--train-size", 96, "--val-size", 37, "--input-dim", 8, "--hidden-size",
       16, "--batch-size", 4, "--epochs", 1, "--device", "cpu"]  # fmt: skip


def test_each_rank_writes_a_chrome_trace_of_the_profiled_steps(tmp_path):
    done = run(train_command(tmp_path, *JOB, "--profile", "3:5"))
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        with open(tmp_path / "profile" / f"rank{rank}.json") as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        labels = {e["name"] for e in events if e["name"].startswith("refddp step ")}
        assert labels == {"refddp step 3", "refddp step 4", "refddp step 5"}
        assert any("Input Dims" in e.get("args", {}) for e in events), "record_shapes"
        assert any(e["name"] == "[memory]" for e in events), "profile_memory"
        assert trace["distributedInfo"]["rank"] == rank
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["rank0.json", "rank1.json"]


def test_a_bad_profile_window_is_one_line_and_exit_2(tmp_path):
    done = run(train_command(tmp_path, "--profile", "5:3"))  # the others: training/test_watching_a_run.py
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: profile: expected START:END, training steps with 1 <= START <= END (say 5:8), "
        "got '5:3'"
    )
