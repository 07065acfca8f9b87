"""PyTorch's own distributed test suites, on ``MultiProcessTestCase`` and on refddp's pools.

    python benchmarks/pytorch_suite.py --tests DIR [--repeats 20] [--xdist 2]
        [--dtensor FILE [FILE ...] --dtensor-k EXPR]

``DIR`` holds ``test_c10d_gloo.py`` and ``test_c10d_common.py`` from PyTorch's repository
(``test/distributed/``; not part of the torch wheel, nor of this repository: bring your own
checkout). Each runner gets its own copy: PyTorch's as it is (``own``), and a port whose only
change is the base class, ``MultiProcessTestCase`` -> ``refddp.testing.DistributedTestCase``,
where a tested class names it (the classes of ``CLASSES`` and the dispatched-collectives base
class in ``test_c10d_common.py``). Then, in one process each, the classes' CPU tests:
PyTorch's runner on ``own`` (``-p no:refddp``); refddp on the port, and again with
``-n XDIST``; refddp on ``own`` itself with ``--dist-torch-suites`` (``unmodified``: no line
changed, the base class swapped before collection); and the local-synchronisation tests
``REPEATS`` times in one session on the port (their groups, named after their ranks, came back
test after test). Where the copy imports a module the installed torch no longer has
(``torch.distributed._spmd``, gone after torch 2.4), that one import is made optional in both
copies, alike, and the record says so.

``--dtensor`` runs other files (DTensorTestBase suites, say ``test/distributed/tensor/
test_dtensor.py``), copied unchanged, under PyTorch's runner and with ``--dist-torch-suites``,
``-k EXPR`` choosing a part that runs on the CPU (PyTorch's runner starts world-size
processes per test, each importing torch: keep the part small).
The recording in benchmarks/README.md used ``--dtensor DIR/test_dtensor.py --dtensor-k
"DTensorTest and (constructor or meta or grad_hint or async_output or shard_tensor)"``
(8 tests, world size 4, about 2 minutes on PyTorch's runner here).

Each runner's verdicts are read from pytest's JUnit XML: counts, wall time, failed tests, and,
for each test whose verdict on refddp differs from PyTorch's runner, its id and one line of
reason (the last exception line of the failure's text).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

CLASSES = ("ProcessGroupGlooTest", "DistributedDataParallelTest", "CommTest", "LargeCommTest",
           "GlooProcessGroupWithDispatchedCollectivesTests")  # fmt: skip
GLOO_FILES = ("test_c10d_gloo.py", "test_c10d_common.py")
LOCAL_SYNC = ("test_new_group_local_sync_sanity_check", "test_new_group_local_sync",
              "test_new_group_local_sync_duplicate_pg")  # fmt: skip
IMPORT = "from refddp.testing import DistributedTestCase\n"
GONE = "from torch.distributed._spmd.comm_tensor import _wait_comm, CommTensor\n"
REPEAT = """import sys, unittest
import test_c10d_gloo as m
names = {names!r}
suite = unittest.TestSuite(m.LargeCommTest(n) for _ in range({repeats}) for n in names)
result = unittest.TextTestRunner(verbosity=0).run(suite)
print(f"{{result.testsRun}} run, {{len(result.failures) + len(result.errors)}} failed")
sys.exit(not result.wasSuccessful())
"""
PYTORCH = ("-p", "no:refddp")  # PyTorch's own runner: MultiProcessTestCase spawns its ranks
UNMODIFIED = ("--dist-torch-suites",)  # refddp's pools, the files as they are


# A class statement's bases, up to MultiProcessTestCase (one line or several).
BASES = re.compile(r"^class (\w+)\(([^()]*?)\b(MultiProcessTestCase|DistributedTestCase)\b", re.M)
PORTED = (*CLASSES, "ProcessGroupWithDispatchedCollectivesTests")
# An exception's line in a traceback or a report: "RuntimeError: ...", "rank 1 failed first: ..."
EXCEPTION_LINE = re.compile(r"^\s*(?:E\s+)?([\w.]*(?:Error|Exception|Failure|Exit|Timeout)\b.*|"
                            r"rank \d+ failed first: .*)$")  # fmt: skip


def _rebase(match: re.Match) -> str:
    if match.group(1) not in PORTED:
        return match.group(0)
    return f"class {match.group(1)}({match.group(2)}DistributedTestCase"


def copy(tests: str, into: str, port: bool) -> list[str]:
    """The two files into ``into``; for the port, the base classes changed. Returns the
    changes made, for the record."""
    changed = []
    for name in GLOO_FILES:
        with open(os.path.join(tests, name)) as f:
            text = f.read()
        if GONE in text:  # the same in both copies
            text = text.replace(GONE, "try:\n    " + GONE + "except ImportError:\n"
                                "    _wait_comm = CommTensor = None\n")  # fmt: skip
            changed.append(f"{name}: the import of torch.distributed._spmd made optional")
        if port:
            text = BASES.sub(_rebase, text)
            ported = [
                m.group(1) for m in BASES.finditer(text) if m.group(3) != "MultiProcessTestCase"
            ]
            changed += [f"{name}: class {c}" for c in ported]
            if ported:
                text = IMPORT + text
        with open(os.path.join(into, name), "w") as f:
            f.write(text)
    return changed


def reason(text: str) -> str:
    """One line for a failure or skip: the last exception line of its text, else its first."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    found = [m.group(1) for m in map(EXCEPTION_LINE.match, lines) if m]
    line = found[-1] if found else (lines[0] if lines else "")
    return line if len(line) <= 240 else line[:237] + "..."


def verdicts(junit: str) -> dict[str, tuple[str, str]]:
    """``Class::test`` -> (passed | failed | error | skipped, one line of reason)."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, why = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                why = reason(f"{node.get('message', '')}\n{node.text or ''}")
                break
        if test in out and out[test][0] != "passed":  # a teardown error after a failure
            continue
        out[test] = (outcome, why)
    return out


def pytest_run(where: str, files: list[str], k: str, *args: str) -> dict:
    """One pytest session in ``where``; its counts, time, failed tests and verdicts."""
    junit = os.path.join(where, f"junit-{time.monotonic_ns()}.xml")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files,
               "-k", k, f"--junitxml={junit}", *args]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, cwd=where, capture_output=True, text=True)
    seconds = time.monotonic() - start
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    tests = verdicts(junit) if os.path.exists(junit) else {}
    counts = {o: sum(v[0] == o for v in tests.values())
              for o in ("passed", "failed", "error", "skipped")}  # fmt: skip
    failed = sorted(t for t, v in tests.items() if v[0] in ("failed", "error"))
    return {"seconds": round(seconds, 1), "summary": summary, **counts, "failed_tests": failed,
            "verdicts": {t: list(v) for t, v in sorted(tests.items())}}  # fmt: skip


def differing(reference: dict, other: dict) -> list[dict]:
    """Tests whose verdict under ``other`` is not the reference's, each with one line of
    reason from the side that did not pass (both, where neither did)."""
    out = []
    ref, oth = reference["verdicts"], other["verdicts"]
    for test in sorted(set(ref) | set(oth)):
        a, b = ref.get(test, ["absent", ""]), oth.get(test, ["absent", ""])
        if a[0] == b[0]:
            continue
        why = [f"{side}: {v[1]}" for side, v in (("PyTorch's runner", a), ("refddp", b))
               if v[0] not in ("passed", "absent") and v[1]]  # fmt: skip
        out.append({"test": test, "pytorch": a[0], "refddp": b[0], "reason": "; ".join(why)})
    return out


def row(name: str, r: dict) -> str:
    failed = r["failed"] + r["error"]
    return f"| {name} | {r['passed']} | {failed} | {r['skipped']} | {r['seconds']} s |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True, help="folder with PyTorch's two test files")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--xdist", type=int, default=2)
    parser.add_argument("--dtensor", nargs="+", default=[], metavar="FILE",
                        help="DTensorTestBase (or other MultiProcessTestCase) files to run both "
                        "ways, unchanged")  # fmt: skip
    parser.add_argument(
        "--dtensor-k", default="", help="pytest -k expression choosing the part of --dtensor to run"
    )
    a = parser.parse_args()
    load_before = os.getloadavg()[0]  # a shared machine: the load says how noisy the times are
    work = tempfile.mkdtemp(prefix="refddp-pytorch-suite-")
    own, port, dtensor = (os.path.join(work, d) for d in ("own", "port", "dtensor"))
    for d in (own, port, dtensor):
        os.makedirs(d)
    gloo, classes = ["test_c10d_gloo.py"], " or ".join(CLASSES)
    try:
        results = {
            "own_changed_lines": copy(a.tests, own, port=False),
            "changed_lines": copy(a.tests, port, port=True),
            "multiprocess_test_case": pytest_run(own, gloo, classes, *PYTORCH),
            "refddp": pytest_run(port, gloo, classes),
            f"refddp_n{a.xdist}": pytest_run(port, gloo, classes, "-n", str(a.xdist)),
            "unmodified": pytest_run(own, gloo, classes, *UNMODIFIED),
        }
        with open(os.path.join(port, "repeat.py"), "w") as f:
            f.write(REPEAT.format(names=LOCAL_SYNC, repeats=a.repeats))
        start = time.monotonic()
        done = subprocess.run([sys.executable, "repeat.py"], cwd=port, capture_output=True,
                              text=True)  # fmt: skip
        results["local_sync_repeated"] = {
            "seconds": round(time.monotonic() - start, 1),
            "summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "",
        }
        if a.dtensor:
            names = []
            for path in a.dtensor:  # byte for byte: the files as the user has them
                shutil.copyfile(path, os.path.join(dtensor, os.path.basename(path)))
                names.append(os.path.basename(path))
            results["dtensor_files"], results["dtensor_k"] = names, a.dtensor_k
            results["dtensor_multiprocess_test_case"] = pytest_run(dtensor, names, a.dtensor_k,
                                                                   *PYTORCH)  # fmt: skip
            results["dtensor_unmodified"] = pytest_run(dtensor, names, a.dtensor_k, *UNMODIFIED)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    reference = results["multiprocess_test_case"]
    results["differing"] = {
        key: differing(reference, results[key])
        for key in ("refddp", f"refddp_n{a.xdist}", "unmodified")
    }
    if a.dtensor:
        results["differing"]["dtensor_unmodified"] = differing(
            results["dtensor_multiprocess_test_case"], results["dtensor_unmodified"]
        )
    rows = ["| runner | passed | failed | skipped | time |", "|---|---|---|---|---|"]
    names = {"multiprocess_test_case": "gloo classes: PyTorch's runner",
             "refddp": "gloo classes: port (base classes changed)",
             f"refddp_n{a.xdist}": f"gloo classes: port, -n {a.xdist}",
             "unmodified": "gloo classes: unmodified, --dist-torch-suites",
             "dtensor_multiprocess_test_case": "DTensor part: PyTorch's runner",
             "dtensor_unmodified": "DTensor part: unmodified, --dist-torch-suites"}  # fmt: skip
    rows += [row(label, results[key]) for key, label in names.items() if key in results]
    rows.append(f"\nlocal-sync tests x{a.repeats}, one session: "
                f"{results['local_sync_repeated']['summary']} "
                f"({results['local_sync_repeated']['seconds']} s)")  # fmt: skip
    for key, diffs in results["differing"].items():
        rows += [f"differs ({key}): {d['test']}: PyTorch's runner {d['pytorch']}, refddp "
                 f"{d['refddp']}; {d['reason']}" for d in diffs]  # fmt: skip
    write("pytorch_suite", results, "\n".join(rows), load_before)


if __name__ == "__main__":
    main()
