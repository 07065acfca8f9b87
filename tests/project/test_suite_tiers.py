"""The suite's tiers hold: heavy tests never share the machine, and every heavy kind is marked.

``make test`` leaves out ``slow`` tests; ``make test-all`` (CI) runs them. Under ``--dist
loadgroup`` the repo's ``conftest.py`` puts every ``heavy`` test in one xdist group, so one
worker runs them one after another: a compile's workers, 64 ranks or a real-node cluster never
load the machine beside another, and no test's deadline depends on such a neighbour.
"""

import ast
import subprocess
import sys
from pathlib import Path

import conftest as repo_conftest

TESTS = Path(__file__).resolve().parents[1]
# Whole modules whose every test is heavy: real nodes, SLURM, 64+ ranks.
HEAVY_MODULES = ("harness/test_cluster.py", "harness/test_cluster_unprivileged.py",
                 "harness/test_harness_real_nodes.py", "commands/test_doctor_network.py",
                 "training/test_scale.py", "slurm/test_slurm.py",
                 "slurm/test_slurm_nodes.py")  # fmt: skip


def test_heavy_tests_share_one_xdist_group(pytester):
    items = pytester.getitems(
        "import pytest\n@pytest.mark.heavy\ndef test_compiles(): pass\ndef test_light(): pass\n"
    )
    repo_conftest.pytest_collection_modifyitems(items)
    groups = {item.name: [m.args for m in item.iter_markers("xdist_group")] for item in items}
    assert groups == {"test_compiles": [("heavy",)], "test_light": []}


def test_every_test_of_a_heavy_module_is_deselected_by_not_heavy():
    paths = [str(TESTS / module) for module in HEAVY_MODULES]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:randomly", "-m", "not heavy",
         *paths], cwd=TESTS.parent, capture_output=True, text=True,
    )  # fmt: skip
    assert "::" not in collected.stdout, collected.stdout  # no test id listed
    assert collected.returncode == 5, collected.stdout + collected.stderr  # no tests ran


def marks_of(node: ast.AST) -> set[str]:
    """The ``pytest.mark.NAME`` names in decorators or a ``pytestmark`` value."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}  # fmt: skip


def test_every_test_that_compiles_is_marked_heavy():
    # torch.compile's inductor starts compile workers that load every core.
    unmarked, found = [], 0
    for path in sorted(TESTS.glob("*/test_*.py")):  # (gpu/ and slurm/ run on their own machines)
        if path.parent.name in ("gpu", "slurm"):
            continue
        if path == Path(__file__):  # (its own source names the words it looks for)
            continue
        tree = ast.parse(path.read_text())
        module_marks = set().union(*(marks_of(n.value) for n in tree.body
                                     if isinstance(n, ast.Assign) and any(
                                         getattr(t, "id", "") == "pytestmark" for t in n.targets)))
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            source = ast.unparse(node)
            if "compile=True" in source or "'--compile'" in source:
                found += 1
                marks = module_marks | set().union(*(marks_of(d) for d in node.decorator_list))
                if "heavy" not in marks:
                    unmarked.append(f"{path.relative_to(TESTS)}::{node.name}")
    assert found >= 2, "the check must see the compile tests"
    assert unmarked == []
