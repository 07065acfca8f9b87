"""The lint finds every planted bug at its line, and nothing in the fixed versions.

Each case in ``tests/lint_cases/`` marks the lines it must be reported at with ``# expect:
CODE``; a case without markers (the ``_fixed`` twins, the symmetric branches) must produce
nothing at all, notes included. A directory is a package, linted as a whole.
"""

import re
from pathlib import Path

import pytest

from refddp.lint import lint_paths

CASES = Path(__file__).resolve().parents[1] / "lint_cases"
EXPECT = re.compile(r"#.*expect: (RDL\d{3})")


def cases() -> list[Path]:
    return sorted(p for p in CASES.iterdir()
                  if p.suffix == ".py" or (p / "__init__.py").exists())  # fmt: skip


def expected(case: Path) -> set[tuple[str, int, str]]:
    files = sorted(case.rglob("*.py")) if case.is_dir() else [case]
    return {(file.name, number, match[1]) for file in files
            for number, line in enumerate(file.read_text().splitlines(), 1)
            for match in [EXPECT.search(line)] if match}  # fmt: skip


@pytest.mark.parametrize("case", cases(), ids=lambda p: p.name)
def test_the_lint_reports_exactly_the_planted_lines(case):
    found = lint_paths([str(case)])
    reported = {(Path(f.path).name, f.line, f.code) for f in found}
    assert reported == expected(case), "\n".join(map(str, found))


def test_every_planted_case_has_a_fixed_twin_that_passes():
    planted = [c for c in cases() if expected(c) and c.stem != "suppressed"]
    assert len(planted) >= 14
    missing = [c.name for c in planted if not (CASES / (c.stem + "_fixed" + c.suffix)).exists()]
    assert missing == [], missing
    assert all(not expected(CASES / (c.stem + "_fixed" + c.suffix)) for c in planted)


def test_every_rule_is_planted_somewhere():
    codes = {code for case in cases() for _, _, code in expected(case)}
    assert codes == {"RDL101", "RDL102", "RDL103", "RDL104", "RDL201"}
