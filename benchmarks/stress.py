"""Flake hunt: run the fault tests and the CLI end-to-end tests many times, as CI would.

    python benchmarks/stress.py [REPETITIONS] [--workers N] [TEST PATHS...]

Each repetition is one pytest session under ``-n WORKERS`` (default 2, like ``make test``),
so pools, ports and processes are set up from scratch every time. Records how often each
test ran and failed, with the tail of every failure, to ``results/stress.json``. Goal
(issue 15): 0 failures in 30 repetitions. ``make stress`` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TESTS = [
    "tests/training/test_faults.py",
    "tests/commands/test_cli.py",
    "tests/launch/test_exit_codes.py",
]


def run_once(tests: list[str], workers: int, report: str) -> float:
    """One pytest session; its junit XML goes to ``report``. Returns the wall time."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", str(workers), f"--junitxml={report}", *tests],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - started


def outcomes(report: str) -> list[tuple[str, str, str]]:
    """(test id, outcome, failure text) for every test case in a junit XML report."""
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            found.append((name, "failed", (problem.text or "")[-2000:]))
        elif case.find("skipped") is not None:
            found.append((name, "skipped", ""))
        else:
            found.append((name, "passed", ""))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("repetitions", nargs="?", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--name", default="stress",
                        help="results go to results/NAME.json (default: stress)")
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    args = parser.parse_intermixed_args()
    runs: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    failures: list[dict[str, object]] = []
    seconds: list[float] = []
    loads: list[float] = []
    failures_so_far = 0
    with tempfile.TemporaryDirectory() as tmp:
        for repetition in range(1, args.repetitions + 1):
            report = os.path.join(tmp, f"{repetition}.xml")
            seconds.append(run_once(args.tests, args.workers, report))
            if not os.path.exists(report):  # pytest itself broke: count it, keep going
                failed["<pytest session>"] += 1
                runs["<pytest session>"] += 1
                continue
            for name, outcome, text in outcomes(report):
                if outcome == "skipped":
                    continue
                runs[name] += 1
                if outcome == "failed":
                    failed[name] += 1
                    failures.append({"repetition": repetition, "test": name, "output": text})
            print(f"repetition {repetition}/{args.repetitions}: {sum(failed.values())} "
                  f"failure(s) so far ({seconds[-1]:.0f} s, load {os.getloadavg()[0]:.1f})",
                  flush=True)  # fmt: skip
            loads.append(os.getloadavg()[0])
            # Written after every repetition: a long hunt stopped early keeps what it found.
            failures_so_far = record(args, repetition, runs, failed, failures, seconds, loads)
    sys.exit(1 if failures_so_far else 0)


def record(
    args: argparse.Namespace, done: int, runs: Counter[str], failed: Counter[str],
    failures: list[dict[str, object]], seconds: list[float], loads: list[float],
) -> int:  # fmt: skip
    """Write what the hunt found so far; returns the number of failed test runs."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    results = {
        "repetitions": done,
        "repetitions_asked": args.repetitions,
        "workers": args.workers,
        "tests": args.tests,
        "commit": commit,
        "test_runs": sum(runs.values()),
        "test_failures": sum(failed.values()),
        "per_test": {n: {"runs": runs[n], "failures": failed[n]} for n in sorted(runs)},
        "failures": failures,
        "seconds_per_repetition": sum(seconds) / max(len(seconds), 1),
        "load_average_1min_after_each_repetition": [round(x, 1) for x in loads],
    }
    rows = [f"{'test':<100} {'runs':>5} {'failed':>6}"]
    rows += [f"{n[-100:]:<100} {runs[n]:>5} {failed[n]:>6}" for n in sorted(runs)]
    rows.append(
        f"{done} repetitions under -n {args.workers} at {commit}: "
        f"{results['test_failures']} failure(s) in {results['test_runs']} test runs"
    )
    write(args.name, results, "\n".join(rows))
    return results["test_failures"]


if __name__ == "__main__":
    main()
