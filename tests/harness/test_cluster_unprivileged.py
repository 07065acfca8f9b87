"""The cluster of real nodes without root (issue 40): where the kernel allows unprivileged user
namespaces, ``refddp.testing.Cluster`` makes its nodes inside one of its own, and the cluster
tests (``test_cluster.py``) pass for a user who is not root: host names, addresses and the
bridge, cleanup after a killed run, a 2 x 2 job bit-identical to one node of four, a node killed
mid-run named and resumed exactly. The harness's real nodes, which need root, skip with that
reason. Run from a test as root (``tests/unprivileged.py`` becomes uid 65534); skipped, with
the reason, where that cannot be done."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import unprivileged

pytestmark = [
    pytest.mark.skipif(unprivileged.why_not() is not None,
                       reason=str(unprivileged.why_not())),  # fmt: skip
    pytest.mark.slow,  # the cluster tests again, as another user: ~90 s
    pytest.mark.heavy,
]

SELECTED = [f"tests/harness/test_cluster.py::{name}" for name in (
    "test_each_node_has_its_host_name_and_address_and_nothing_outlives_the_cluster",
    "test_a_killed_test_run_leaves_no_namespace_behind",
    "test_two_nodes_of_two_end_bit_identical_to_one_node_of_four[static]",
    "test_a_node_killed_mid_run_ends_the_job_in_seconds_and_the_rerun_is_exact",
)] + ["tests/harness/test_harness_real_nodes.py"]  # fmt: skip


@pytest.fixture
def workdir(tmp_path):
    """A home for the unprivileged user: not under tmp_path, whose parents are root's alone
    (0700). (tmp_path, root's, holds the mount points of ``unprivileged.command``.)"""
    home = Path(tempfile.mkdtemp(prefix="refddp-unprivileged-"))
    home.chmod(0o777)
    try:
        yield home
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)


def as_nobody(argv: list[str], home: Path, originals: Path,
              timeout: float) -> subprocess.CompletedProcess:  # fmt: skip
    try:
        command = unprivileged.command(argv, originals)
    except ValueError as exc:  # a Python installed behind two closed directories
        pytest.skip(f"this Python cannot be opened to an unprivileged user: {exc}")
    return subprocess.run(command, capture_output=True, text=True,
                          cwd=unprivileged.REPO, env=unprivileged.environment(home),
                          timeout=timeout)  # fmt: skip


def test_the_cluster_tests_pass_for_a_user_without_root(workdir, tmp_path):
    # Whether this kernel gives the user a user namespace with a network of its own, asked
    # of the kernel itself: where it does, the cluster must be there for them.
    kernel = as_nobody(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"],
                       workdir, tmp_path, timeout=60)  # fmt: skip
    if kernel.returncode:
        pytest.skip(f"no user namespaces for an unprivileged user here: {kernel.stderr.strip()}")
    probe = as_nobody([sys.executable, "-c", "import os, refddp.testing.cluster as c; "
                       "print(os.geteuid(), c.unavailable())"], workdir, tmp_path,
                      timeout=60)  # fmt: skip
    assert probe.stdout.strip() == f"{unprivileged.NOBODY} None", probe.stdout + probe.stderr
    done = as_nobody([sys.executable, "-m", "pytest", "-x", "-q", "-rs", "-p", "no:randomly",
                      *SELECTED], workdir, tmp_path, timeout=400)  # fmt: skip
    said = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, said
    # Every selected cluster test ran (none skipped for want of root) as the user without root;
    # the harness's real-node tests were skipped, each saying why.
    assert re.search(r"\b4 passed, \d+ skipped\b", done.stdout), said
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("test_harness_real_nodes.py" in line for line in skipped), said
    assert all("real nodes in the harness need root's capabilities" in line
               for line in skipped), said  # fmt: skip
