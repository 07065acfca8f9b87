"""The CLI tests' runner: a run that hangs fails the test with every process's stacks."""

import sys

import pytest

from tests.cli_runs import RunHung, run, run_nodes

# A parent and a forked child, both stuck in a function whose name the stacks must show.
HANGS_IN_TWO_PROCESSES = """
import os, time
def stuck_in_the_parent(): time.sleep(600)
def stuck_in_the_child(): time.sleep(600)
if os.fork() == 0:
    stuck_in_the_child()
print("started", flush=True)
stuck_in_the_parent()
"""


def test_a_hung_run_fails_with_the_stacks_of_the_process_and_its_children():
    with pytest.raises(RunHung) as caught:
        run([sys.executable, "-c", HANGS_IN_TWO_PROCESSES], timeout=3)
    report = str(caught.value)
    assert "timed out after 3 seconds" in report and "started" in report
    assert "stuck_in_the_parent" in report and "stuck_in_the_child" in report


def test_hung_nodes_fail_with_every_nodes_output_and_stacks():
    # A multi-node test's hang must say which node hung where, not only that one timed out.
    finished = [sys.executable, "-c", "print('node done', flush=True)"]
    hung = [sys.executable, "-c", HANGS_IN_TWO_PROCESSES]
    with pytest.raises(RunHung) as caught:
        run_nodes([finished, hung], timeout=3)
    report = str(caught.value)
    assert "--- node 0 (exit 0):\nnode done" in report, report
    assert "--- node 1 (exit " in report and "stuck_in_the_parent" in report, report
