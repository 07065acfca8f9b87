"""The lint's three doors: the command, ``pytest --dist-lint`` and the flake8 plugin.

The command prints one line per finding and exits 0 (nothing, or notes only), 1 (findings,
or notes under ``--strict``) or 2 (a path that does not exist: one line naming it; a file
that does not parse: one line naming each, the others still checked). Nothing it lints is
imported or run.
"""

import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "lint_cases"
BAD, FIXED = CASES / "barrier_in_rank0_branch.py", CASES / "barrier_in_rank0_branch_fixed.py"
NOTES = CASES / "cannot_tell.py"


def lint(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "refddp.lint", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_findings_are_one_line_each_and_exit_1():
    result = lint(BAD.relative_to(REPO), FIXED.relative_to(REPO))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "tests/lint_cases/barrier_in_rank0_branch.py:10:9: RDL101 dist.barrier() under "
        "`dist.get_rank() == 0` (rank-dependent since tests/lint_cases/barrier_in_rank0_branch"
        ".py:8, `dist.get_rank()`): the other ranks issue no collective to match it"]
    assert "1 finding(s), 0 note(s)" in result.stderr


def test_clean_code_and_notes_alone_exit_0_and_strict_counts_notes():
    assert lint(FIXED).returncode == 0
    notes = lint(NOTES)
    assert notes.returncode == 0 and len(notes.stdout.splitlines()) == 5
    assert all(" RDL201 cannot tell whether " in line for line in notes.stdout.splitlines())
    assert lint("--strict", NOTES).returncode == 1
    assert lint("--no-notes", NOTES).stdout == ""


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: tmp / "missing.py", "missing.py: no such file or directory"),
    (lambda tmp: tmp / "broken.py", "broken.py:1: cannot parse: "),
])  # fmt: skip
def test_a_bad_path_is_one_line_naming_it_and_exit_2(tmp_path, make, expected):
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    result = lint(make(tmp_path))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.stdout == "" and len(errors) == 1 and expected in errors[0]
    assert "Traceback" not in result.stderr


def test_each_file_that_does_not_parse_is_named_and_the_others_are_still_checked(tmp_path):
    # One bad file used to end the run at its line: the others' findings went unreported.
    shutil.copy(BAD, tmp_path / "train.py")
    (tmp_path / "py2_leftover.py").write_text("print 'hello'\n")
    (tmp_path / "deep.py").write_text("x = " + "+".join(["1"] * 5000) + "\n")  # (generated)
    # Python runs these two: a byte-order mark (Windows editors) and a coding line.
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfimport torch\n")
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9'\n")
    result = lint(tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = sorted(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert len(errors) == 2, result.stderr
    assert "deep.py: cannot parse: nested too deeply" in errors[0]
    assert "py2_leftover.py:1: cannot parse: " in errors[1]
    assert [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()] == ["RDL101"]
    assert "1 finding(s), 0 note(s), 2 file(s) not read" in result.stderr


def test_directories_are_searched_and_linted_as_one_package(tmp_path):
    shutil.copytree(CASES / "cross_file", tmp_path / "pkg")
    (tmp_path / "pkg" / ".hidden").mkdir()
    (tmp_path / "pkg" / ".hidden" / "skipped.py").write_text("def f(:\n")
    result = lint(tmp_path)
    assert result.returncode == 1
    assert [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()] == [
        "RDL101", "RDL101"]
    assert all("/pkg/train.py:" in line for line in result.stdout.splitlines())


def test_nothing_linted_is_imported_or_run(tmp_path):
    planted = tmp_path / "side_effects.py"
    planted.write_text("import pathlib\npathlib.Path(__file__).with_suffix('.ran').touch()\n"
                       "raise SystemExit(3)\n")  # fmt: skip
    assert lint(planted).returncode == 0
    assert not planted.with_suffix(".ran").exists()


def run_pytest(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args,
                                         timeout=240)  # fmt: skip


def test_dist_lint_adds_one_item_per_file_failing_with_its_findings(pytester):
    pytester.makepyfile(bad=BAD.read_text(), fixed=FIXED.read_text(), notes=NOTES.read_text(),
                        test_plain="def test_plain():\n    assert True\n")  # fmt: skip
    result = run_pytest(pytester, "--dist-lint", "bad.py", "--dist-lint", "fixed.py",
                        "--dist-lint", "notes.py", "test_plain.py", "-rA")  # fmt: skip
    result.assert_outcomes(passed=3, failed=1, warnings=5)
    result.stdout.fnmatch_lines(["*bad.py:10:9: RDL101 dist.barrier() under*",
                                 "*notes.py:13:9: RDL201 cannot tell whether callback()*",
                                 "PASSED fixed.py::dist-lint", "PASSED notes.py::dist-lint",
                                 "FAILED bad.py::dist-lint - bad.py:10:9: RDL101*"])  # fmt: skip


def test_dist_lint_on_a_missing_path_is_a_usage_error(pytester):
    result = run_pytest(pytester, "--dist-lint", "nowhere/")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dist-lint: nowhere/: no such file or directory*"])


def test_the_flake8_entry_point_names_the_plugin():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '[project.entry-points."flake8.extension"]\nRDL = "refddp.lint.flake8:Plugin"' in (
        pyproject)
    from refddp.lint.flake8 import Plugin

    assert Plugin.name and Plugin.version
    found = list(Plugin(compile(BAD.read_text(), "bad.py", "exec", 0x400), str(BAD)).run())
    assert [(line, col, text.split()[0]) for line, col, text, _ in found] == [(10, 8, "RDL101")]


def test_flake8_reports_rdl_codes_and_honours_noqa(tmp_path):
    pytest.importorskip("flake8")
    config = tmp_path / "flake8.ini"  # the plugin as a local one, unless refddp's entry point is
    installed = any(e.name == "RDL" for e in entry_points(group="flake8.extension"))
    config.write_text("[flake8]\n" if installed else
                      "[flake8:local-plugins]\nextension =\n    RDL = refddp.lint.flake8:Plugin\n")
    shutil.copy(BAD, tmp_path / "bad.py")
    (tmp_path / "silenced.py").write_text(BAD.read_text().replace(
        "dist.barrier()", "dist.barrier()  # noqa: RDL101"))  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "flake8", "--config", str(config), "--select",
                             "RDL", "bad.py", "silenced.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1
    assert [line.split(" ")[:2] for line in result.stdout.splitlines()] == [
        ["bad.py:10:9:", "RDL101"]]


def test_a_note_in_the_else_branch_says_the_condition_is_false():
    from refddp.lint import lint_source

    source = ("import torch.distributed as dist\n\ndef f(callback, log):\n"
              "    if dist.get_rank() == 0:\n        log()\n    else:\n        callback()\n")  # fmt: skip
    notes = {f.line: f.message for f in lint_source(source)}
    assert "it runs only where `dist.get_rank() == 0` (" in notes[5]
    assert "it runs only where `dist.get_rank() == 0` is false (" in notes[7], notes


def test_a_note_after_an_early_return_says_where_the_rest_runs():
    from refddp.lint import lint_source

    source = ("import torch.distributed as dist\n\ndef f(callback):\n"
              "    if dist.get_rank() != 0:\n        return\n    callback()\n")  # fmt: skip
    (note,) = lint_source(source)
    assert "it runs only where `dist.get_rank() != 0` is false (" in note.message, note


def test_a_call_between_two_turns_is_said_to_run_on_every_rank_at_two_places():
    from refddp.lint import lint_source

    # "Rank 0 goes first" with a callback between the two turns: it runs on every rank, before
    # the barrier on some and after it on the others, not "only where" a condition holds.
    source = ("import torch.distributed as dist\n\ndef first(fn):\n"
              "    if dist.get_rank() != 0:\n        dist.barrier()\n    fn()\n"
              "    if dist.get_rank() == 0:\n        dist.barrier()\n")  # fmt: skip
    (note,) = lint_source(source)
    assert note.code == "RDL201" and note.line == 6, note
    assert ('it runs between the two turns of a "rank 0 goes first", before the collectives '
            "of line 4 where `dist.get_rank() != 0` and after those of line 7 on the other "
            "ranks (") in note.message, note  # fmt: skip
