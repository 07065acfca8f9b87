"""Writing a run directory's files so that a crash or a full disk loses nothing.

A checkpoint file is written to a temporary file that is fsynced and renamed over the target
(``save_atomic``): a crash leaves the old file or the new one, never half of one. A write that
fails (a full disk, say) is one line naming the file (``RunFileError``, exit 1), for the
checkpoints of every format and for ``history.jsonl``, ``eval.json`` and ``predictions.pt``
(``writing``). Temporary files a killed writer left behind are removed by the next save.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
from collections.abc import Iterator
from typing import Any

import torch

LOCK_NAME = ".refddp.lock"  # in the run directory, held by the training run that writes it


class RunDirectoryInUse(RuntimeError):
    """Another training run holds the run directory (``hold_run_directory``)."""


def hold_run_directory(out: str) -> Any:
    """Hold ``out`` for this training run until this process ends; returns what must stay
    referenced meanwhile (None where no lock can be taken: then nothing is held).

    Why: two runs on one directory (one started twice by mistake, or requeued while the first
    still runs) would resume from each other's checkpoints and write one history between them.
    The second is refused instead, naming the first's host and pid. The lock is a POSIX
    record lock (``lockf``): it belongs to this process alone (not to the loader workers it
    forks, which could outlive it) and the kernel drops it when the process exits, however it
    ends. A directory this process cannot use is left to the checks that name it (none held).
    """
    try:
        os.makedirs(out, exist_ok=True)
        held = open(os.path.join(out, LOCK_NAME), "a+")  # noqa: SIM115 - held until the process ends
    except OSError:
        return None
    try:
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        busy = exc.errno in (errno.EACCES, errno.EAGAIN)
        holder = ""
        if busy:
            held.seek(0)
            holder = held.read().strip() or "unknown"
        held.close()
        if not busy:  # a filesystem without locks (some network ones): none is held
            return None
        raise RunDirectoryInUse(
            f"out: {out} is in use by another training run ({holder}); wait for it to end, "
            "stop it, or give another --out"
        ) from None
    held.seek(0)
    held.truncate()
    held.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    held.flush()
    return held


class RunFileError(RuntimeError):
    """A run-directory file (checkpoint, history, eval, predictions) could not be written.

    A runtime failure, not a usage error: one line naming the file, exit code 1.
    """


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Report an I/O failure while writing ``path`` (a full disk, say) as one line naming it."""
    try:
        yield
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as RuntimeError
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RunFileError(f"cannot write {path}: {reason.strip().splitlines()[0]}") from None


def checkpoint_dir(out: str) -> str:
    """The directory of the run ``out`` that holds its checkpoints, in every format."""
    return os.path.join(out, "checkpoints")


def fsync_path(path: str) -> None:
    """Make ``path`` durable: a file's bytes, or a directory's entries (a rename, a new link)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _KeepWriteError:
    """A file whose write errors are kept: torch.save reports them only as an opaque
    RuntimeError ("unexpected pos ..."), which would hide the cause (a full disk, say)."""

    def __init__(self, f: Any):
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj: Any, f: Any) -> None:
    """``torch.save`` into the open binary file ``f``; a failed write raises its ``OSError``."""
    kept = _KeepWriteError(f)
    try:
        torch.save(obj, kept)
        f.flush()
    except RuntimeError:
        if kept.error is not None:
            raise kept.error from None
        raise


_TEMP = re.compile(r"\.tmp-(\d+)$")  # temp_name's files: save_atomic's, link_or_copy's, ...


def temp_name(path: str) -> str:
    """The temporary name this process writes ``path`` under before renaming it into place."""
    return f"{path}.tmp-{os.getpid()}"


def remove_stale_temp_files(directory: str) -> None:
    """Delete temporary files that writers killed mid-write left behind (their PID is gone)."""
    for name in os.listdir(directory):
        match = _TEMP.search(name)
        if match and not _pid_alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, from a write of this process that failed: stale too
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def save_atomic(state: dict[str, Any], path: str) -> None:
    """Write the checkpoint file ``path`` so that a crash at any moment leaves the old intact."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, temp_name("." + os.path.basename(path)))
    with writing(f"checkpoint {path}"), _without_crc32():
        try:
            with open(tmp, "wb") as f:
                torch_save(state, f)
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        fsync_path(directory)


@contextlib.contextmanager
def _without_crc32() -> Iterator[None]:
    """torch.load never checks the zip's CRC32s (a flipped byte loads silently), and computing
    them costs ~a quarter of a large save (benchmarks/checkpoint_io.py): skip them where torch
    lets us (``set_crc32_options``, torch >= 2.6; before, the save computes them)."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    if get is None:
        yield
        return
    crc32 = get()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(crc32)


def is_within(path: str, directory: str) -> bool:
    """Whether ``path``, or what its links lead to, lies in ``directory``."""
    return any(where(path).startswith(where(directory) + os.sep)
               for where in (os.path.abspath, os.path.realpath))  # fmt: skip


def remove_names(directory: str, names: list[str]) -> None:
    """Remove the files (or links) ``names`` in ``directory`` where they exist."""
    with writing(directory):
        removed = [path for path in (os.path.join(directory, n) for n in names)
                   if os.path.lexists(path)]  # fmt: skip
        for path in removed:
            os.remove(path)
        if removed:
            fsync_path(directory)  # gone for good: a crash does not bring them back


def link_or_copy(src: str, dst: str) -> None:
    """Point the checkpoint file ``dst`` at ``src``'s bytes atomically (a hard link; a copy
    where links fail)."""
    tmp = temp_name(dst)
    with writing(f"checkpoint {dst}"):
        try:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            try:
                os.link(src, tmp)
            except OSError:
                with open(src, "rb") as fin, open(tmp, "wb") as fout:
                    while chunk := fin.read(1 << 24):
                        fout.write(chunk)
                    fout.flush()
                    os.fsync(fout.fileno())
            os.replace(tmp, dst)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
