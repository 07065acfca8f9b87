"""refddp.dist.end_process: how every rank process ends (issue 15: no SIGABRT after a run)."""

import subprocess
import sys

import pytest

from tests.cli_runs import REPO

SCRIPT = """
import atexit, sys, torch, torch.distributed as dist
from refddp.dist import end_process

def main():
    atexit.register(lambda: print("exit handlers ran"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # DDP keeps the group, so gloo's threads outlive destroy_process_group into the exit.
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
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
