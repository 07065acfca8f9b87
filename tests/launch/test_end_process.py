"""refddp.launch.exits.end_process: how every rank process ends (issue 15: no SIGABRT after a run)."""

import subprocess
import sys

import pytest

from tests.cli_runs import REPO

SCRIPT = """
import atexit, sys, torch, torch.distributed as dist
from refddp.launch.exits import end_process

def main():
    atexit.register(lambda: print("exit handlers ran"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    # Freed before the group, as refddp's ranks do (see run_rank): a DDP reducer that holds the
    # last reference to a destroyed gloo group joins gloo's threads holding the GIL, while one
    # of them may need the GIL to free the backward's all-reduce: a deadlock (torch 2.13).
    del model
    dist.destroy_process_group()
    print("unflushed output", end="")
    {ending}

end_process(main)
"""


@pytest.mark.parametrize(
    "ending, code", [("return 0", 0), ("return 3", 3), ("sys.exit(4)", 4), ("raise KeyError('bug')", 1)]
)
def test_end_process_runs_exit_handlers_flushes_and_keeps_the_exit_code(ending, code):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(ending=ending)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert done.stdout.startswith("unflushed output") and "exit handlers ran" in done.stdout
    assert "terminate called" not in done.stderr
    assert ("KeyError: 'bug'" in done.stderr) == (code == 1)  # a bug keeps its traceback


GROUP_FREED = """
import gc, torch, torch.distributed as dist
import refddp.launch.dist  # what refddp's ranks import before they create a group

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))  # imports torch._dynamo
model(torch.ones(1, 2)).sum().backward()
del model
gc.collect()
dist.destroy_process_group()
from tests.user_code import native_thread_names  # only now: its imports must not mask ours
print([t for t in native_thread_names() if "gloo" in t])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/task")
def test_destroying_the_group_after_ddp_stops_gloo_threads():
    """DDP imports torch.distributed.nn.functional after init_process_group; that module binds
    group.WORLD as a default argument, so the group and its threads would outlive
    destroy_process_group. refddp.launch.dist imports it before any group exists."""
    done = subprocess.run([sys.executable, "-c", GROUP_FREED], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_teardown_logs_instead_of_raising_when_leaving_the_group_fails(monkeypatch, caplog):
    """teardown runs in ``finally``: its own error must not replace the run's."""
    import refddp.launch.dist as rd

    def fail():
        raise RuntimeError("NCCL communicator was aborted")

    monkeypatch.setattr(rd, "_owns_group", True)
    monkeypatch.setattr(rd.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(rd.dist, "destroy_process_group", fail)
    rd.teardown()
    assert "leaving the process group failed" in caplog.text
    assert "NCCL communicator was aborted" in caplog.text
    assert rd._owns_group is False


@pytest.mark.parametrize("version", [(2, 5), (2, 7), (2, 8), (2, 13)])
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("ends_unfinalized", [True, False])
def test_a_process_about_to_exit_leaves_the_group_except_before_torch_2_8(
    monkeypatch, version, backend, ends_unfinalized
):
    """torch 2.5's destroy_process_group of a gloo group now and then hung after a finished
    run (torch's fix is in 2.8 by its date; 2.6 and 2.7 untested); a process that end_process
    ends skips it there, and only there."""
    import refddp.config.torch_support as support
    import refddp.launch.dist as rd

    left = []
    monkeypatch.setattr(support, "torch_version", lambda: version)
    monkeypatch.setattr(rd, "_owns_group", True)
    monkeypatch.setattr(rd, "_ends_unfinalized", ends_unfinalized)
    monkeypatch.setattr(rd.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(rd.dist, "get_backend", lambda: backend)
    monkeypatch.setattr(rd.dist, "destroy_process_group", lambda: left.append(True))
    rd.teardown()
    skipped = ends_unfinalized and version < (2, 8) and backend == "gloo"
    assert left == ([] if skipped else [True])
    assert rd._owns_group is False


def test_end_process_marks_its_process_as_one_that_exits_unfinalized():
    done = subprocess.run(
        [sys.executable, "-c", "import refddp.launch.dist as rd\n"
         "from refddp.launch.exits import end_process\n"
         "end_process(lambda: 0 if rd._ends_unfinalized else 5)"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_teardown_frees_the_run_before_it_leaves_the_group(monkeypatch):
    """A DDP reducer holding the last reference to a destroyed group can deadlock the exit
    (``dist._free_the_run``): teardown frees what holds it, in a failing rank's frames or in
    reference cycles, before it destroys the group."""
    import refddp.launch.dist as rd

    events = []

    class Reducer:  # stands for DDP's reducer, which holds the group
        def __del__(self):
            events.append("run freed")

    def fit():
        reducer = Reducer()
        reducer.cycle = reducer  # only the cycle collector frees it, once the frame lets go
        raise RuntimeError("a bug in the rank")

    monkeypatch.setattr(rd, "_owns_group", True)
    monkeypatch.setattr(rd.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(rd.dist, "destroy_process_group", lambda: events.append("group left"))
    with pytest.raises(RuntimeError, match="a bug in the rank"):
        try:
            fit()
        finally:
            rd.teardown()
    assert events == ["run freed", "group left"]
