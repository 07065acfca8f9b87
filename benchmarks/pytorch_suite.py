"""PyTorch's own gloo tests, on ``MultiProcessTestCase`` and on refddp's pools, side by side.

    python benchmarks/pytorch_suite.py --tests DIR [--repeats 20] [--xdist 2]

``DIR`` holds ``test_c10d_gloo.py`` and ``test_c10d_common.py`` from PyTorch's repository
(``test/distributed/``; not part of the torch wheel, nor of this repository: bring your own
checkout). Each runner gets its own copy: PyTorch's as it is, and a port whose only change is
the base class, ``MultiProcessTestCase`` -> ``refddp.testing.DistributedTestCase``, where a
tested class names it (the classes of ``CLASSES`` and the dispatched-collectives base class in
``test_c10d_common.py``). Then, in one process each: the classes' CPU tests under both, the
port again with ``-n XDIST``, and the local-synchronisation tests ``REPEATS`` times in one
session (their groups, named after their ranks, came back test after test). Where the copy
imports a module the installed torch no longer has (``torch.distributed._spmd``, gone after
torch 2.4), that one import is made optional in both copies, alike.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record import write  # noqa: E402

CLASSES = ("ProcessGroupGlooTest", "DistributedDataParallelTest", "CommTest", "LargeCommTest",
           "GlooProcessGroupWithDispatchedCollectivesTests")  # fmt: skip
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


# A class statement's bases, up to MultiProcessTestCase (one line or several).
BASES = re.compile(r"^class (\w+)\(([^()]*?)\b(MultiProcessTestCase|DistributedTestCase)\b", re.M)
PORTED = (*CLASSES, "ProcessGroupWithDispatchedCollectivesTests")


def _rebase(match: re.Match) -> str:
    if match.group(1) not in PORTED:
        return match.group(0)
    return f"class {match.group(1)}({match.group(2)}DistributedTestCase"


def copy(tests: str, into: str, port: bool) -> list[str]:
    """The two files into ``into``; for the port, the base classes changed. Returns the
    classes changed, for the record."""
    changed = []
    for name in ("test_c10d_gloo.py", "test_c10d_common.py"):
        with open(os.path.join(tests, name)) as f:
            text = f.read()
        if GONE in text:  # the same in both copies
            text = text.replace(GONE, "try:\n    " + GONE + "except ImportError:\n"
                                "    _wait_comm = CommTensor = None\n")  # fmt: skip
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


def pytest_run(where: str, *args: str) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_c10d_gloo.py",
               "-k", " or ".join(CLASSES), *args]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, cwd=where, capture_output=True, text=True)
    seconds = time.monotonic() - start
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    failed = sorted(set(re.findall(r"^FAILED test_c10d_gloo.py::(\S+)", done.stdout, re.M)))
    return {"seconds": round(seconds, 1), "summary": summary, **counts, "failed_tests": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True, help="folder with PyTorch's two test files")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--xdist", type=int, default=2)
    a = parser.parse_args()
    work = tempfile.mkdtemp(prefix="refddp-pytorch-suite-")
    own, port = os.path.join(work, "own"), os.path.join(work, "port")
    os.makedirs(own), os.makedirs(port)
    copy(a.tests, own, port=False)
    changed = copy(a.tests, port, port=True)
    try:
        results = {
            "changed_lines": changed,
            "multiprocess_test_case": pytest_run(own, "-p", "no:refddp", "-rf"),
            "refddp": pytest_run(port, "-rf"),
            f"refddp_n{a.xdist}": pytest_run(port, "-rf", "-n", str(a.xdist)),
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
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = ["| runner | passed | failed | skipped | time |", "|---|---|---|---|---|"]
    for key in ("multiprocess_test_case", "refddp", f"refddp_n{a.xdist}"):
        r = results[key]
        rows.append(f"| {key} | {r.get('passed', 0)} | {r.get('failed', 0)} | "
                    f"{r.get('skipped', 0)} | {r['seconds']} s |")  # fmt: skip
    rows.append(f"\nlocal-sync tests x{a.repeats}, one session: "
                f"{results['local_sync_repeated']['summary']} "
                f"({results['local_sync_repeated']['seconds']} s)")  # fmt: skip
    table = "\n".join(rows)
    print(table)
    write("pytorch_suite", results, table)


if __name__ == "__main__":
    main()
