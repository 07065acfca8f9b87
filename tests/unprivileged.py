"""A command run as an unprivileged user (uid 65534, ``nobody``) by a test run as root: what
users' CI often is, for the tests of what refddp does without root.

The command runs in a mount namespace of its own, where this Python, its packages and the
repository are reachable: a directory on the way to them that others may not enter (``/root``,
mode 0700, where pyenv installs Python) is covered there by a tmpfs holding only the entries
that lead on, each bind-mounted from the original. Nothing changes outside that namespace.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
from pathlib import Path

NOBODY = 65534
REPO = Path(__file__).resolve().parents[1]


def why_not() -> str | None:
    """Why no command can be run as an unprivileged user here, or None."""
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    if os.geteuid() != 0:
        return "becoming an unprivileged user needs root (run as one, the tests need no switch)"
    for tool in ("setpriv", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` command (util-linux)"
    return None


def _closed_directories(paths: list[Path]) -> dict[Path, set[str]]:
    """Each directory on the way to ``paths`` that others may not enter, with the entries in
    it that lead on. (A second closed directory below the first is not handled: ValueError.)"""
    closed: dict[Path, set[str]] = {}
    for path in paths:
        parts = path.resolve().parts
        first = None
        for depth in range(1, len(parts)):
            directory = Path(*parts[:depth])
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                if first is not None:
                    raise ValueError(f"{directory}: a second closed directory on the way to {path}")
                first = directory
                closed.setdefault(directory, set()).add(parts[depth])
    return closed


def command(argv: list[str], originals: Path) -> list[str]:
    """``argv`` as run by ``nobody`` (see the module's docstring); ``originals``, a directory
    of root's alone, holds the mount points of the covered directories' originals."""
    paths = [Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix), REPO]
    lines = ["set -e"]
    for n, (directory, entries) in enumerate(sorted(_closed_directories(paths).items())):
        keep = originals / f"original-{n}"
        keep.mkdir(exist_ok=True)
        covered, kept = shlex.quote(str(directory)), shlex.quote(str(keep))
        lines += [f"mount --bind {covered} {kept}", f"mount -t tmpfs -o mode=755 tmpfs {covered}"]
        for entry in sorted(entries):
            inside = shlex.quote(str(directory / entry))
            make = "mkdir" if (directory / entry).is_dir() else "touch"
            lines += [f"{make} {inside}", f"mount --bind {shlex.quote(str(keep / entry))} {inside}"]
    lines.append(f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            "\n".join(lines), "sh", *argv]  # fmt: skip


def environment(home: Path) -> dict[str, str]:
    """The environment for it: a home it may write, no bytecode written into the repository,
    and nothing of this pytest-xdist worker's (a pytest it starts is a session of its own)."""
    ours = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return {**ours, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
