"""Fixtures, classes and parametrization in rank-side tests, through pytester as a project would
see them: what a rank gets is set up and torn down per test; what it cannot get is refused at
setup in one line, and the module's other tests run."""

import pytest

PER_TEST_FIXTURES = """
import os
import pytest
import torch.distributed as dist


@pytest.fixture
def settings():
    return {"lr": 0.5}


@pytest.mark.multiproc
def test_patches_on_every_rank(dist_ctx, monkeypatch, tmp_path, settings):
    monkeypatch.setenv("REFDDP_LEAK", str(dist_ctx.rank))
    monkeypatch.setattr(os, "getcwd", lambda: "patched")
    (tmp_path / f"rank{dist_ctx.rank}").touch()
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert settings == {"lr": 0.5}


@pytest.mark.multiproc
def test_next_test_sees_no_patch(dist_ctx):
    assert "REFDDP_LEAK" not in os.environ, f"leaked into rank {dist_ctx.rank}"
    assert os.getcwd() != "patched"
"""


def run_inner(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=240)


def test_monkeypatch_on_ranks_is_undone_after_each_test(pytester):
    pytester.makepyfile(test_fixtures=PER_TEST_FIXTURES)
    run_inner(pytester, "-v").assert_outcomes(passed=2)


@pytest.mark.parametrize("fixture", ["capsys", "caplog", "request", "pytestconfig"])
def test_process_bound_fixture_fails_that_test_at_setup_in_one_line_and_the_rest_run(
    pytester, fixture
):
    pytester.makepyfile(
        test_bound=f"""
import pytest

@pytest.mark.multiproc
def test_uses_it(dist_ctx, {fixture}):
    pass

def test_unrelated():
    pass

@pytest.mark.multiproc
def test_on_ranks_too(dist_ctx):
    pass
"""
    )
    result = run_inner(pytester, "-rE")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # not INTERRUPTED: the session ran on
    result.assert_outcomes(passed=2, errors=1)
    assert "ERROR at setup of test_uses_it" in result.stdout.str()
    message = (
        f"test_bound.py::test_uses_it: fixture '{fixture}' cannot be used in a rank-side test "
        "(@pytest.mark.multiproc): ranks get dist_ctx, monkeypatch, tmp_path, tmpdir and your "
        "own fixtures with picklable values"
    )
    assert any(line.endswith(message) for line in result.stdout.lines), result.stdout.str()
    assert "_refddp_world_size" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


def test_unpicklable_fixture_value_fails_that_test_naming_the_fixture(pytester):
    pytester.makepyfile(
        test_lock="""
import threading
import pytest

@pytest.fixture
def lock():
    return threading.Lock()

@pytest.mark.multiproc
def test_uses_lock(dist_ctx, lock):
    pass
"""
    )
    result = run_inner(pytester)
    result.assert_outcomes(failed=1)
    assert "cannot send argument 'lock' of test_uses_lock to the ranks" in result.stdout.str()
    assert "_refddp_world_size" not in result.stdout.str()


CLASSES_AND_PARAMS = """
import pytest
import torch
import torch.distributed as dist


def rank_of():
    return dist.get_rank()


@pytest.mark.world_size(3)
class TestInAClass:
    factor = 10

    def test_spawn(self, spawn):
        assert spawn(rank_of) == [0, 1, 2]

    @pytest.mark.multiproc
    def test_on_ranks(self, dist_ctx):
        assert dist.get_world_size() == 3 and self.factor == 10


@pytest.mark.multiproc
@pytest.mark.parametrize("value", [1.0, 2.5])
def test_parametrized_on_ranks(dist_ctx, value):
    t = torch.tensor([value])
    dist.all_reduce(t)
    assert t.item() == 2 * value


@pytest.mark.parametrize("where", [pytest.param("ranks", marks=pytest.mark.multiproc), "driver"])
def test_marks_from_param(where):
    assert dist.is_initialized() == (where == "ranks")
"""


def test_classes_parametrize_and_param_marks_run_where_marked(pytester):
    pytester.makepyfile(test_shapes=CLASSES_AND_PARAMS)
    result = run_inner(pytester, "-v")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*TestInAClass::test_spawn*world_size=3* PASSED*"])


IGNORED_WORLD_SIZES = """
import pytest
import torch.distributed as dist


@pytest.mark.multiproc
@pytest.mark.parametrize("size", [2, pytest.param(3, marks=pytest.mark.world_size(3))])
def test_in_a_param(dist_ctx, size):
    assert dist.get_world_size() == size


@pytest.mark.world_size(2)
@pytest.mark.world_size(3)
def test_stacked(spawn):
    pass


@pytest.mark.world_size(3)
def test_once(spawn):
    assert spawn(dist.get_world_size) == [3, 3, 3]
"""


def test_a_world_size_mark_that_would_be_ignored_fails_that_test_in_one_line(pytester):
    # Marks inside a pytest.param come after the sizes were read; of two marks one counts:
    # both would run the test at a size it did not ask for.
    pytester.makepyfile(test_sizes=IGNORED_WORLD_SIZES)
    result = run_inner(pytester, "-v")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines([
        "*test_in_a_param[[]3[]]*a world_size mark inside pytest.param is not applied; put "
        "@pytest.mark.world_size(...) on the function, class or module*",
        "*test_stacked*2 world_size marks on one test, of which only one is applied; give every "
        "size in one: @pytest.mark.world_size(*)*",
    ])  # fmt: skip
