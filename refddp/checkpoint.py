"""The plain checkpoint file: atomic writes, safe loads and finding what to resume from.

What a training checkpoint holds and how a run continues from it: ``refddp/run_state.py``;
the sharded directory format (``--ckpt-format dcp``): ``refddp/checkpoint_dcp.py``.

A checkpoint is a plain dict that ``torch.load(path, weights_only=True)`` opens; model keys are
clean (no ``module.`` / ``_orig_mod.``), so it loads into a bare model in any process. Writes
go to a temporary file that is fsynced and renamed over the target: a crash leaves either the
old file or the new one, never half of one, and the one before stays as ``checkpoint_previous``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from refddp.config import ConfigError, TrainConfig

LATEST = "checkpoint_latest.pth"
PREVIOUS = "checkpoint_previous.pth"
BEST = "checkpoint_best.pth"
FORMAT_VERSION = 1  # bump when a key changes meaning; load_checkpoint refuses newer files
REQUIRED_KEYS = (
    "model_state_dict",
    "optimizer_state_dict",
    "scaler_state_dict",
    "epoch",
    "step",
    "world_size",
    "config",
    "metrics",
)
_PREFIXES = ("module.", "_orig_mod.")

log = logging.getLogger("refddp")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: printed as one line naming the file."""


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
    return os.path.join(out, "checkpoints")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP and/or torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def clean_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """Strip ``module.`` and ``_orig_mod.`` from keys (for checkpoints saved by other tools)."""
    cleaned = {}
    for key, value in state.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


def rng_state() -> dict[str, Any]:
    """This process's random states, in types weights_only loading accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _fsync_dir(path: str) -> None:
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


_TEMP = re.compile(r"\.tmp-(\d+)$")  # save_atomic's and _link_or_copy's temporary files


def _temp_name(path: str) -> str:
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
    """Write ``state`` to ``path`` so that a crash at any moment leaves the old file intact."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, _temp_name("." + os.path.basename(path)))
    # torch.load never checks the zip's CRC32s (a flipped byte loads silently), and computing
    # them costs ~a quarter of a large save (benchmarks/checkpoint_io.py): skip them.
    crc32 = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        with writing(f"checkpoint {path}"):
            try:
                with open(tmp, "wb") as f:
                    torch_save(state, f)
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
            _fsync_dir(directory)
    finally:
        torch.serialization.set_crc32_options(crc32)


def _link_or_copy(src: str, dst: str) -> None:
    """Point ``dst`` at ``src``'s bytes atomically (a hard link; a copy where links fail)."""
    tmp = _temp_name(dst)
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


def write_checkpoint(state: dict[str, Any], out: str, is_best: bool) -> str:
    """Save ``state`` as the latest checkpoint (keeping the one before), and as best if so."""
    directory = checkpoint_dir(out)
    with writing(directory):
        os.makedirs(directory, exist_ok=True)
        remove_stale_temp_files(directory)
    latest = os.path.join(directory, LATEST)
    if os.path.exists(latest):
        _link_or_copy(latest, os.path.join(directory, PREVIOUS))
    save_atomic(state, latest)
    if is_best:
        _link_or_copy(latest, os.path.join(directory, BEST))
    with writing(directory):
        _fsync_dir(directory)
    return latest


def load_checkpoint(path: str, required: tuple[str, ...] = REQUIRED_KEYS) -> dict[str, Any]:
    """Open a checkpoint with ``weights_only=True``; every failure is one line naming the file.

    A directory is a sharded (dcp) checkpoint: its run state, with the model's keys and shapes
    (``checkpoint_dcp.load_run_state``).
    """
    if os.path.isdir(path):
        from refddp import checkpoint_dcp

        return checkpoint_dcp.load_run_state(path)
    if os.path.islink(path) and not os.path.exists(path):
        raise CheckpointError(
            f"resume: {path} is a dangling link (its target {os.readlink(path)} is gone)"
        )
    if not os.path.isfile(path):
        raise CheckpointError(f"resume: checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        needs = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
        if needs:
            raise CheckpointError(
                f"{path}: refused: it needs pickled code ({needs.group(1)}) to load, and "
                "refddp only loads checkpoints with torch.load(weights_only=True)"
            ) from None
        raise CheckpointError(
            f"{path}: corrupt or truncated checkpoint (not a torch file)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated zip, bad magic, ...: all "corrupt"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({first})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a refddp checkpoint (not a dict)")
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a refddp checkpoint (missing {', '.join(missing)})")
    version = state.get("format_version", 1)  # files from before the key existed are version 1
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format_version {version!r} is newer than this refddp reads "
            f"(format_version {FORMAT_VERSION}); load it with a newer refddp"
        )
    return state


def load_resume_checkpoint(c: TrainConfig) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint ``resume`` names, loaded once: ``(path, state)``, or None to start fresh.

    ``auto`` takes the latest in ``out``, falling back (with a warning) to the previous one if
    the latest is unreadable. eval and predict need a checkpoint: finding none is an error.
    """
    if c.resume == "never":
        found = None
    elif c.resume != "auto":
        found = (c.resume, load_checkpoint(c.resume))
    else:  # the newest of the two formats' latest checkpoints (a run may switch format)
        from refddp import checkpoint_dcp

        directory = checkpoint_dir(c.out)
        pairs = ((LATEST, PREVIOUS), (checkpoint_dcp.LATEST, checkpoint_dcp.PREVIOUS))
        candidates = [
            _latest_loadable(os.path.join(directory, latest), os.path.join(directory, previous))
            for latest, previous in pairs
        ]
        found = max((f for f in candidates if f), key=lambda f: f[1]["step"], default=None)
    if found is None and c.task != "train":
        raise CheckpointError(
            f"resume: no checkpoint in {checkpoint_dir(c.out)}; "
            f"--task {c.task} needs --resume PATH or a trained --out"
        )
    return found


def _latest_loadable(latest: str, previous: str) -> tuple[str, dict[str, Any]] | None:
    """``latest`` loaded, or ``previous`` (with a warning) if ``latest`` is unreadable.

    A dangling link (``lexists``, not ``exists``) is unreadable, not absent: resume never
    silently starts from step 0 in a directory that has checkpoints."""
    latest_error = None
    for path in (latest, previous):
        if not os.path.lexists(path):
            continue
        try:
            found = (path, load_checkpoint(path))
        except CheckpointError as exc:
            if path == previous or not os.path.lexists(previous):
                raise  # nothing older to fall back to
            latest_error = exc
            continue
        if latest_error is not None:
            log.warning("warning: %s; resuming from the older %s instead", latest_error, path)
        return found
    return None


def check_model_compatible(model: nn.Module, state: dict[str, Any], path: str) -> None:
    """Fail with one line naming missing, unexpected and mis-shaped keys."""
    ours = unwrap(model).state_dict()
    theirs = clean_state_dict(state)
    missing = [k for k in ours if k not in theirs]
    unexpected = [k for k in theirs if k not in ours]
    shapes = [
        f"{k} {tuple(theirs[k].shape)} vs {tuple(ours[k].shape)}"
        for k in ours
        if k in theirs and tuple(theirs[k].shape) != tuple(ours[k].shape)
    ]

    def few(keys: list[str]) -> str:
        return ", ".join(keys[:4]) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "")

    problems = []
    if missing:
        problems.append(f"missing keys: {few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {few(unexpected)}")
    if shapes:
        problems.append(f"shape mismatch: {few(shapes)}")
    if problems:
        raise CheckpointError(f"{path}: does not fit this model; " + "; ".join(problems))


def load_model_weights(model: nn.Module, state: dict[str, Any], path: str) -> None:
    """The checkpoint's weights into a plain (unsharded) model, in this process alone."""
    if "dcp_checkpoint" in state:  # a sharded checkpoint: read it whole
        from refddp import checkpoint_dcp

        state = checkpoint_dcp.load_full(state)
    check_model_compatible(model, state["model_state_dict"], path)
    unwrap(model).load_state_dict(clean_state_dict(state["model_state_dict"]))
