"""The lint's tables of collectives cover torch.distributed, and the lint needs no torch.

``refddp/lint/collectives.py`` keeps its own list (importing the harness's record of
collectives would import torch): every public function ``torch.distributed`` exports must be
classified in it, as a collective, point-to-point, or neither, so a collective a new torch
adds fails here until the lint knows it.
"""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from refddp.lint import collectives as tables

CASES = Path(__file__).resolve().parents[1] / "lint_cases"


def public_functions(module) -> set[str]:
    return {name for name in dir(module) if not name.startswith("_")
            and callable(getattr(module, name)) and not inspect.isclass(getattr(module, name))
            and not inspect.ismodule(getattr(module, name))}  # fmt: skip


def test_every_public_function_of_torch_distributed_is_classified():
    dist = pytest.importorskip("torch.distributed")
    known = tables.COLLECTIVES | tables.POINT_TO_POINT | tables.NOT_COLLECTIVES
    assert sorted(public_functions(dist) - known) == []


def test_the_collectives_the_harness_records_are_collectives_or_point_to_point_for_the_lint():
    pytest.importorskip("torch")
    from refddp.testing.checks.collectives import _COLLECTIVES

    assert set(_COLLECTIVES) - tables.COLLECTIVES - tables.POINT_TO_POINT == set()


def test_the_tables_classify_each_name_once():
    assert not tables.COLLECTIVES & tables.POINT_TO_POINT
    assert not tables.COLLECTIVES & tables.NOT_COLLECTIVES
    assert not tables.POINT_TO_POINT & tables.NOT_COLLECTIVES


def test_point_to_point_calls_are_not_collectives_and_dcp_save_is():
    assert tables.library_call("torch.distributed.send").kind == "safe"
    assert tables.library_call("torch.distributed.barrier").kind == "collective"
    assert tables.library_call("torch.distributed.checkpoint.save").kind == "collective"
    assert tables.library_call("torch.distributed.some_new_call").kind == "unknown"
    assert tables.library_call("numpy.save").kind == "safe"


def test_linting_imports_no_torch():
    code = ("import sys; from refddp.lint import lint_paths; "
            f"lint_paths([{str(CASES)!r}]); print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == "False"
