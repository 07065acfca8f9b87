"""Every benchmark script imports: a stale ``from refddp.x import y`` breaks a benchmark only on
the machine that runs it (the GPU ones run nowhere in CI), so it is caught here instead."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_benchmark_script_imports(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    name = f"_benchmark_{Path(script).stem}"
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as missing:
        top = (missing.name or "").split(".")[0]
        if top == "refddp" or (BENCHMARKS / f"{top}.py").exists():
            raise
        pytest.skip(f"needs the optional package {top} (the bench extra)")
    if '__name__ == "__main__"' in (BENCHMARKS / script).read_text():
        assert callable(getattr(module, "main", None)), f"{script} runs but has no main()"
