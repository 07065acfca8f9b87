"""Every mutant of ``tests/mutation/mutants.py`` still applies, checked in a second.

The full mutation run takes ~18 minutes; without this check a refactor that moves a snippet
silently turns its mutant "not applicable" until someone runs it. The rule is the runner's
own (``tests/mutation/run.py::mutated``).
"""

import re

from tests.mutation.mutants import MUTANTS, Mutant
from tests.mutation.run import REPO, mutated, read


def test_every_mutants_snippet_occurs_exactly_once_in_its_file():
    stale = [f"{m.name} ({m.file})" for m in MUTANTS if mutated(read(REPO, m), m) is None]
    assert not stale, "snippet not found exactly once (update it in mutants.py): " + ", ".join(
        stale
    )


def test_every_mutants_tests_exist():
    missing = []
    for mutant in MUTANTS:
        for test in mutant.tests:
            file, _, name = test.partition("::")
            text = (REPO / file).read_text() if (REPO / file).is_file() else ""
            function = re.sub(r"\[.*\]$", "", name)
            if not text or (function and f"def {function}(" not in text):
                missing.append(f"{mutant.name}: {test}")
    assert not missing, "tests that do not exist: " + ", ".join(missing)


def test_a_snippet_found_twice_or_nowhere_makes_a_mutant_not_applicable():
    mutant = Mutant("m", "a guarantee", "f.py", "x = 1", "x = 2", ("t",))
    assert mutated("x = 1\ny = 1\n", mutant) == "x = 2\ny = 1\n"
    assert mutated("x = 1\nx = 1\n", mutant) is None
    assert mutated("y = 1\n", mutant) is None
