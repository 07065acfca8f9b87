"""Checkpoints in any format: load one, find the one to resume from, put its weights in a model.

The entry points the trainer, the commands and users call. Which format a checkpoint is in,
and so which module writes and reads it, is ``refddp/checkpoints/formats.py``'s to say: the
plain file (``refddp/checkpoints/full.py``) or the sharded directory
(``refddp/checkpoints/dcp.py``). What a checkpoint holds, and continuing a run from it:
``refddp/checkpoints/run_state.py``; writing files atomically: ``refddp/checkpoints/run_files.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from torch import nn

from refddp.checkpoints import formats as checkpoint_formats
from refddp.checkpoints.run_files import checkpoint_dir
from refddp.checkpoints.run_state import (
    CheckpointError,
    check_model_compatible,
    clean_state_dict,
    unwrap,
)
from refddp.config.schema import TrainConfig
from refddp.launch.error_file import LAUNCHED_ENV

log = logging.getLogger("refddp")


def load_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path``, in any format, as ``run_state.restore`` takes it; every
    failure is one line naming the file. Nothing in it runs code.

    A sharded (dcp) checkpoint's tensors are not read: its ``model_state_dict`` holds meta
    tensors of the saved shapes (enough to check that a model fits); ``load_full_checkpoint``
    reads them."""
    return checkpoint_formats.owning(path).load_run_state(path)


def load_full_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path``, in any format, as the dict the full format's file holds
    (the same keys, every tensor read): in this process alone, with no process group, at
    any world size the checkpoint was written at. Every failure is one line naming it."""
    fmt = checkpoint_formats.owning(path)
    return fmt.load_full(fmt.load_run_state(path))


def load_resume_checkpoint(c: TrainConfig) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint ``resume`` names, loaded once: ``(path, state)``, or None to start fresh.

    ``auto`` takes the latest in ``out``, falling back (with a warning) to the previous one if
    the latest is unreadable. eval and predict need a checkpoint: finding none is an error.
    """
    if c.resume == "never":
        found = None
    elif c.resume != "auto":
        found = (c.resume, load_checkpoint(c.resume))
    else:  # the newest of every format's latest checkpoint (a run may switch format)
        directory = checkpoint_dir(c.out)
        candidates = [_latest_loadable(*fmt.latest(directory))
                      for fmt in checkpoint_formats.every()]  # fmt: skip
        found = max((f for f in candidates if f), key=lambda f: f[1]["step"], default=None)
    if found is None and c.task != "train" and c.resume == "never":
        raise CheckpointError(
            f"resume: --task {c.task} needs a checkpoint, which resume: never rules out; "
            "give --resume auto (the latest in --out) or --resume PATH"
        )
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
        if latest_error is not None and _says_the_fallback(latest):
            log.warning("warning: %s; resuming from the older %s instead", latest_error, path)
        return found
    return None


_said: set[str] = set()  # the latest checkpoints this process has warned of


def _says_the_fallback(latest: str) -> bool:
    """Once a job: refddp's launcher where it started the ranks (they load the same files
    after it), else rank 0 (torchrun, srun), each once although it loads the files twice."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))  # before the group
    if os.environ.get(LAUNCHED_ENV) or rank != "0" or latest in _said:
        return False
    _said.add(latest)
    return True


def load_model_weights(model: nn.Module, state: dict[str, Any], path: str) -> None:
    """The weights of ``state``, loaded from ``path`` (a sharded one is read whole here), into
    a plain (unsharded) model, in this process alone."""
    state = checkpoint_formats.owning(path).load_full(state)
    check_model_compatible(model, state["model_state_dict"], path)
    unwrap(model).load_state_dict(clean_state_dict(state["model_state_dict"]))
