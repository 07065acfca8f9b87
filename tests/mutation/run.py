"""Mutation check: does each guarantee's test fail when its mechanism is removed?

Copies the tree to a temporary directory (the working tree is never touched), applies one
mutant at a time from ``tests/mutation/mutants.py``, runs that mutant's tests there and
reports killed / survived / not applicable (its snippet is not in the file exactly once: the
code changed, and the mutant must be updated). Run serially; it is CPU-heavy::

    python tests/mutation/run.py [--only NAME ...] [--no-baseline] [--json PATH]

Exit status: 0 when every applicable mutant is killed or documented as equivalent, 1 otherwise.
Not part of CI (``make mutation``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.mutation.mutants import MUTANTS, Mutant  # noqa: E402

IGNORED = shutil.ignore_patterns(
    ".git", ".venv*", "runs", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info"
)
TEST_TIMEOUT_S = 300  # one mutant's few tests: past it, the mutant hung them (killed)
BASELINE_TIMEOUT_S = 3600  # every mutant's tests at once, one after another


def run_tests(tree: Path, tests: tuple[str, ...] | list[str],
              timeout: float = TEST_TIMEOUT_S) -> tuple[int, float, str]:  # fmt: skip
    """pytest on ``tests`` inside ``tree``, stopping at the first failure."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return -1, time.monotonic() - start, "timed out"
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, time.monotonic() - start, tail[-1] if tail else ""


def imports(module: str) -> bool:
    """``module`` ("" for none) imports in this python (a failed import of any kind: no)."""
    if not module:
        return True
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def outcome(returncode: int, mutant: Mutant) -> str:
    if returncode == 0:
        return "survived (equivalent)" if mutant.equivalent else "SURVIVED"
    if returncode in (1, -1):  # a test failed, or the mutant hung the run: either way, caught
        return "killed"
    return f"ERROR (pytest exit {returncode})"  # collection/usage error: not a verdict


def mutated(text: str, mutant: Mutant) -> str | None:
    """``text`` with ``mutant`` applied, or None if its snippet is not in it exactly once."""
    if text.count(mutant.original) != 1:
        return None
    return text.replace(mutant.original, mutant.replacement)


def read(tree: Path, mutant: Mutant) -> str:
    """The text of the file ``mutant`` changes ("" if there is none)."""
    path = tree / mutant.file
    return path.read_text() if path.exists() else ""


def apply(tree: Path, mutant: Mutant) -> str | None:
    """Apply ``mutant`` in ``tree``; the file's original text, or None if not applicable."""
    text = read(tree, mutant)
    changed = mutated(text, mutant)
    if changed is None:
        return None
    (tree / mutant.file).write_text(changed)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant names to run (default: all)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip checking that the tests pass on the unmutated tree")  # fmt: skip
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:40} {m.file:32} {m.guarantee}")
        return 0
    unknown = set(args.only or ()) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")

    with tempfile.TemporaryDirectory(prefix="refddp-mutation-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(REPO, tree, ignore=IGNORED)
        if not args.no_baseline:
            tests = sorted({t for m in mutants for t in m.tests})
            code, took, last = run_tests(tree, tests, BASELINE_TIMEOUT_S)
            print(f"baseline: {len(tests)} test selections, exit {code} in {took:.0f} s: {last}")
            if code != 0:
                print("the tests fail on the unmutated tree: no mutant can be judged")
                return 1
        results = []
        for m in mutants:
            if not imports(m.needs):
                results.append({"name": m.name, "outcome": f"NEEDS {m.needs}", "seconds": 0.0,
                                "detail": f"{m.needs} does not import here: its tests skip"})  # fmt: skip
            elif (original := apply(tree, m)) is None:
                results.append({"name": m.name, "outcome": "NOT APPLICABLE", "seconds": 0.0,
                                "detail": f"snippet not found exactly once in {m.file}"})  # fmt: skip
            else:
                try:
                    code, took, last = run_tests(tree, m.tests)
                finally:
                    (tree / m.file).write_text(original)
                results.append({"name": m.name, "outcome": outcome(code, m),
                                "seconds": round(took, 1), "detail": m.equivalent or last})  # fmt: skip
            r = results[-1]
            print(f"{r['outcome']:24} {m.name:40} {r['seconds']:6.1f} s  {r['detail']}",
                  flush=True)  # fmt: skip

    unjudged = [r["name"] for r in results if r["outcome"].startswith("NEEDS")]
    judged = [r for r in results
              if r["outcome"] != "NOT APPLICABLE" and r["name"] not in unjudged]  # fmt: skip
    killed = sum(r["outcome"] == "killed" for r in judged)
    equivalent = sum(r["outcome"] == "survived (equivalent)" for r in judged)
    missing = [r["name"] for r in results if r["outcome"] == "NOT APPLICABLE"]
    bad = [r["name"] for r in judged if r["outcome"] not in ("killed", "survived (equivalent)")]
    print(f"\nscore: {killed}/{len(judged) - equivalent} killed "
          f"({equivalent} documented equivalent, {len(missing)} not applicable)")  # fmt: skip
    if missing:
        print("NOT APPLICABLE (update their snippets in tests/mutation/mutants.py): "
              + ", ".join(missing))  # fmt: skip
    if unjudged:
        print("not judged here (a module their tests need does not import; run them with a "
              "python that has it, e.g. .venv-torch-2.14.1/bin/python): " + ", ".join(unjudged))
    if bad:
        print("SURVIVED or ERROR: " + ", ".join(bad))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
