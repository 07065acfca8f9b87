"""The pytest plugin, driven through pytester: in a subprocess, as a user's project would run it,
and in process where a test is about a session run inside another."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.test_harness import STOP_NESTED_POOLS

BEHAVIOUR = """
import os
import pytest
import torch
import torch.distributed as dist


@pytest.mark.multiproc
@pytest.mark.world_size(2, 3)
def test_sizes(dist_ctx):
    assert dist.get_world_size() == dist_ctx.world_size


@pytest.mark.multiproc
def test_fails_on_rank_1(dist_ctx):
    print("hello from", dist_ctx.rank)
    assert dist_ctx.rank == 0, "rank one disagrees"


@pytest.mark.multiproc(timeout=2)
def test_rank0_only_barrier(dist_ctx):
    if dist_ctx.rank == 0:
        dist.barrier()


@pytest.mark.multiproc
def test_skipped_on_ranks(dist_ctx):
    pytest.skip("skipped inside the ranks")


@pytest.mark.gpu
@pytest.mark.multiproc
def test_needs_two_gpus(dist_ctx):
    pass


def rank_of():
    return dist.get_rank()


def test_spawn_helper(spawn):
    assert spawn(rank_of) == [0, 1]


def test_plain():
    assert True
"""


def run_inner(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=240)


A_POOL_AT_IMPORT = STOP_NESTED_POOLS + """
from refddp.testing import spawn_ranks


def one():
    return 1


ONES = spawn_ranks(one, world_size=2)


def test_ones():
    assert ONES == [1, 1]
"""


def test_a_test_module_starting_a_pool_at_import_is_refused_in_the_ranks(pytester):
    # The ranks import the test module to find ``one``: its top-level spawn_ranks would
    # start a pool in every rank, and theirs in every one of theirs.
    pytester.makepyfile(test_pool_at_import=A_POOL_AT_IMPORT)
    result = run_inner(pytester)
    assert result.ret != 0
    out = result.stdout.str()
    assert "a RankPool was started while a rank loaded the driver's script or test module" in out


@pytest.mark.parametrize("import_mode", ["prepend", "importlib"])
def test_outcomes_by_rank_under_each_import_mode(pytester, monkeypatch, import_mode):
    # The inner run must see no GPU (the gpu test's skip says "found 0") on any machine.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_behaviour=BEHAVIOUR)
    result = run_inner(pytester, f"--import-mode={import_mode}", "-rs", "-v")
    result.assert_outcomes(passed=4, failed=2, skipped=2)
    out = result.stdout.str()
    assert "world_size=3" in out
    assert "rank one disagrees" in out and "[rank 1] hello from 1" in out
    # Rank 0 alone in a barrier: a certain hang once rank 1 has finished, reported at the
    # deadline or by the one-sided check (2 s as well), whichever comes first.
    assert "RankTimeout" in out and (
        "did not finish within 2 s" in out or "which rank(s) [0] are blocked in (a certain hang" in out
    ), out
    assert "needs 2 CUDA GPU(s) with NCCL, found 0" in out
    assert "skipped inside the ranks" in out


IN_A_DIRECTORY_WITHOUT_INIT = """
import pytest
import torch.distributed as dist


def rank_of():
    return dist.get_rank()


def test_spawn_sends_this_module_s_function(spawn):
    assert spawn(rank_of) == [0, 1]


@pytest.mark.multiproc
def test_on_the_ranks(dist_ctx):
    dist.barrier()
"""


@pytest.mark.parametrize("shadow", [False, True], ids=["plain", "a-same-named-module-in-cwd"])
def test_importlib_mode_run_from_outside_the_rootdir(pytester, shadow):
    # pytest names the test module ``qa_t.test_imp`` (rootdir-relative); ``qa_t`` itself is
    # importable nowhere. Run from another directory, as CI and tox do, the ranks must still
    # find the module's functions, and must not import a module of that name from the
    # directory pytest was started in, which the driver cannot see.
    (pytester.path / "project" / "qa_t").mkdir(parents=True)
    (pytester.path / "project" / "pytest.ini").write_text("[pytest]\n")
    (pytester.path / "project" / "qa_t" / "test_imp.py").write_text(IN_A_DIRECTORY_WITHOUT_INIT)
    elsewhere = pytester.path / "elsewhere"
    elsewhere.mkdir()
    if shadow:
        (elsewhere / "qa_t.py").write_text(
            "import os\nopen(os.path.join(os.path.dirname(__file__), 'SHADOW_RAN'), 'w').close()\n"
        )
    project = pytester.path / "project"
    # The ``pytest`` command, whose path, unlike ``python -m pytest``'s (or pytester's, which
    # adds the cwd to PYTHONPATH), lacks the cwd.
    command = [os.path.join(os.path.dirname(sys.executable), "pytest"), "-p", "no:cacheprovider",
               "--import-mode=importlib", f"--rootdir={project}", str(project / "qa_t")]  # fmt: skip
    result = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=240,
                            check=False)  # fmt: skip
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout + result.stderr
    assert not (elsewhere / "SHADOW_RAN").exists(), "a rank imported the module in pytest's cwd"


def test_a_session_without_distributed_tests_never_imports_torch(pytester):
    """The plugin loads in every pytest session of a project that installs refddp; one that
    runs no distributed test must not pay for importing torch (seconds, on every run)."""
    pytester.makeconftest("""
        import sys

        def pytest_sessionfinish(session):
            with open("torch_imported.txt", "w") as f:
                f.write(str("torch" in sys.modules))
    """)
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = run_inner(pytester)  # the plugin loads through its pytest11 entry point
    result.assert_outcomes(passed=1)
    assert "--dist-timeout" in run_inner(pytester, "--help").stdout.str()  # the plugin loaded
    assert (pytester.path / "torch_imported.txt").read_text() == "False"


def test_on_a_torch_below_the_floor_each_distributed_test_fails_in_one_line(pytester):
    pytester.makeconftest("""
        import torch

        torch.__version__ = "2.4.1"  # what an older pinned project would have
    """)
    pytester.makepyfile(test_behaviour=BEHAVIOUR)
    result = run_inner(pytester, "-k", "sizes or spawn_helper or plain")
    result.assert_outcomes(passed=1, failed=3)  # test_sizes runs at world sizes 2 and 3
    out = result.stdout.str()
    said = "refddp.testing: refddp needs torch >= 2.5; this is torch 2.4.1"
    assert out.count(f"\n{said}\n") == 3, out  # each failure's whole report: the one line


def test_marker_selection_picks_spawn_tests_and_strict_markers_pass(pytester):
    pytester.makepyfile(test_behaviour=BEHAVIOUR)
    result = run_inner(pytester, "-m", "multiproc", "--strict-markers", "--collect-only", "-q")
    out = result.stdout.str()
    assert "test_spawn_helper" in out and "test_sizes[world_size=3]" in out
    assert "test_plain" not in out


@pytest.mark.slow  # a project suite run twice: ~26 s (compat runs it)
def test_no_dist_debug_option_turns_fingerprinting_off(pytester):
    pytester.makepyfile(
        test_env="""
import os
import pytest

@pytest.mark.multiproc
def test_env(dist_ctx):
    assert os.environ["TORCH_DISTRIBUTED_DEBUG"] == "OFF"
"""
    )
    run_inner(pytester, "--no-dist-debug").assert_outcomes(passed=1)
    run_inner(pytester).assert_outcomes(failed=1)


HANGING = """
import os
import pytest
import torch.distributed as dist


@pytest.mark.multiproc(timeout=600)
def test_hang(dist_ctx, tmp_path):
    with open(os.environ["PID_DIR"] + f"/rank{dist_ctx.rank}", "w") as f:
        f.write(str(os.getpid()))
    if dist_ctx.rank == 0:
        dist.barrier()
"""


def _wait_for(predicate, deadline_s, what):
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_rank_outlives_the_session_after_interrupt_or_kill(pytester, tmp_path, sig):
    pytester.makepyfile(test_hanging=HANGING)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_hanging.py"],
        cwd=pytester.path,
        env={**os.environ, "PID_DIR": str(pid_dir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # A rank's file exists before its pid is written in it: wait for both pids.
        def written() -> list[int]:
            return [int(text) for p in pid_dir.iterdir() if (text := p.read_text())]

        _wait_for(lambda: len(written()) == 2, 120, "both ranks to write their pids")
        pids = written()
        assert all(_alive(p) for p in pids)
        inner.send_signal(sig)
        inner.wait(timeout=60)
        _wait_for(lambda: not any(_alive(p) for p in pids), 15, "ranks to exit")
    finally:
        if inner.poll() is None:
            inner.kill()


BAD_DEADLINES = """
import math
import pytest
from refddp.testing import DistributedTestCase


def nothing():
    pass


@pytest.mark.multiproc(timeout=-1)
def test_marker(dist_ctx):
    pass


def test_spawn(spawn):
    spawn(nothing, timeout=math.nan)


@pytest.mark.multiproc(timeout=10**12)
def test_marker_past_a_week(dist_ctx):
    pass


class TestCase(DistributedTestCase):
    timeout = math.inf

    def test_method(self):
        pass
"""


def test_a_deadline_that_is_not_a_finite_number_of_seconds_is_one_line_naming_where(pytester):
    # A NaN deadline crashed the driver's wait (selectors' own error, deep in a traceback);
    # a negative one failed every test as a hang, at once.
    pytester.makepyfile(test_bad_deadlines=BAD_DEADLINES)
    result = run_inner(pytester, "--dist-timeout=nan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "argument --dist-timeout: expected a number of seconds > 0, at most a week, got nan" in (
        result.stderr.str()
    )
    result = run_inner(pytester)
    result.assert_outcomes(failed=4)  # (before any rank ran)
    out = result.stdout.str()
    for line in ("multiproc(timeout=...): expected a number of seconds > 0, at most a week, got -1",
                 "spawn(timeout=...): expected a number of seconds > 0, at most a week, got nan",
                 "multiproc(timeout=...): expected a number of seconds > 0, at most a week, got "
                 "1000000000000",
                 "TestCase.timeout: expected a number of seconds > 0, at most a week, got "
                 "inf"):  # fmt: skip
        assert line in out, out
    assert "RankTimeout" not in out and "selectors" not in out
    start = out.index("= FAILURES =")
    failures = out[start : out.index("\n=", start)]  # to the next section (warnings, summary)
    assert "Traceback" not in failures and not re.search(r"\.py:\d+", failures), failures


def test_a_pytest_session_run_inside_another_leaves_the_outer_ones_options(pytester, request):
    # A project that runs pytest.main (or pytester in process) from a test: the inner session
    # reads its own options, and once it ends the outer one's apply again (DistributedTestCase
    # takes them from the running session, as it gets no fixtures; the rank server preloads
    # the outer session's --dist-preload modules).
    from refddp.testing.driver import rank_server
    from refddp.testing.driver.unittest_case import _option

    outer = request.config.getoption("dist_timeout")
    assert _option("dist_timeout", None) == outer
    preloaded = list(rank_server.preload)
    pytester.makeconftest("""
        from refddp.testing.driver.unittest_case import _option

        def pytest_sessionfinish(session):
            with open("inner_timeout.txt", "w") as f:
                f.write(repr(_option("dist_timeout", None)))
    """)
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    inner = outer + 7.0
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dist-timeout", str(inner),
                                          "--dist-preload", "json")  # fmt: skip
    result.assert_outcomes(passed=1)
    assert (pytester.path / "inner_timeout.txt").read_text() == repr(inner)
    assert _option("dist_timeout", None) == outer
    assert rank_server.preload == preloaded
