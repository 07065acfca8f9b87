"""The full checkpoint format (``--ckpt-format full``, the default): one plain file.

Rank 0 holds the whole run state, model and optimizer tensors gathered
(``run_state.build_state``), and writes ``checkpoints/checkpoint_latest.pth``: a plain dict
that ``torch.load(path, weights_only=True)`` opens in any process, model keys clean (no
``module.`` / ``_orig_mod.``), so it loads into a bare model. The write is atomic
(``run_files.save_atomic``): a crash leaves the old file or the new one, never half of one;
the one before stays as ``checkpoint_previous.pth``, the best as ``checkpoint_best.pth``
(hard links, copies where links fail).

A format of ``refddp/checkpoints/formats.py``, and the one every other converts to
(``load_full``). A dcp checkpoint's ``run_state.pth`` is such a file too (``load_run_state``).
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import torch

from refddp.checkpoints.run_files import (
    checkpoint_dir,
    fsync_path,
    link_or_copy,
    remove_names,
    remove_stale_temp_files,
    save_atomic,
    writing,
)
from refddp.checkpoints.run_state import (
    FORMAT_VERSION,
    REQUIRED_KEYS,
    CheckpointError,
    RunParts,
    clean_state_dict,
)
from refddp.launch.dist import rank0_then_meet

LATEST = "checkpoint_latest.pth"
PREVIOUS = "checkpoint_previous.pth"
BEST = "checkpoint_best.pth"
GATHERS_TENSORS = True


def owns(path: str) -> bool:
    """Any path: asked last (``checkpoint_formats.owning``), the plain file takes what no
    other format owns, so its loader names a missing, dangling or damaged path."""
    return True


def latest(checkpoints: str) -> tuple[str, str]:
    return os.path.join(checkpoints, LATEST), os.path.join(checkpoints, PREVIOUS)


def write(state: dict[str, Any], parts: RunParts, out: str, is_best: bool) -> str | None:
    """Every rank calls it; rank 0 writes the gathered ``state``; all meet."""
    return rank0_then_meet(lambda: write_checkpoint(state, out, is_best))


def write_checkpoint(state: dict[str, Any], out: str, is_best: bool) -> str:
    """Save ``state`` as the latest checkpoint (keeping the one before), and as best if so."""
    directory = checkpoint_dir(out)
    with writing(directory):
        os.makedirs(directory, exist_ok=True)
        remove_stale_temp_files(directory)
    latest = os.path.join(directory, LATEST)
    if os.path.exists(latest):
        link_or_copy(latest, os.path.join(directory, PREVIOUS))
    save_atomic(on_cpu(state), latest)
    if is_best:
        link_or_copy(latest, os.path.join(directory, BEST))
    with writing(directory):
        fsync_path(directory)
    return latest


def forget(checkpoints: str, keep: tuple[str, ...] = ()) -> None:
    remove_names(checkpoints, [name for name in (LATEST, PREVIOUS, BEST) if name not in keep])


def on_cpu(tree: Any, copies: dict[tuple, torch.Tensor] | None = None) -> Any:
    """``tree`` (a checkpoint's dicts, lists and tuples) with every tensor on the CPU, so the
    file opens where the writer's GPU is absent (FSDP gathers to the CPU already). Tied
    tensors (the same view twice: an embedding shared with the output layer) stay one
    tensor; what holds no GPU tensor is returned as it is (a state dict's ``_metadata``
    kept). Not ``batches.to_device``: that one copies without blocking and keeps no ties."""
    copies = {} if copies is None else copies
    if isinstance(tree, torch.Tensor):
        if tree.device.type == "cpu":
            return tree
        key = (tree.device, tree.data_ptr(), tree.dtype, tuple(tree.shape), tree.stride())
        if key not in copies:
            copies[key] = tree.detach().cpu()
        return copies[key]
    if isinstance(tree, dict):
        moved = {key: on_cpu(value, copies) for key, value in tree.items()}
        if all(moved[key] is value for key, value in tree.items()):
            return tree
        out = type(tree)(moved)
        if hasattr(tree, "_metadata"):
            out._metadata = tree._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(tree, list | tuple):
        items = [on_cpu(value, copies) for value in tree]
        if all(new is old for new, old in zip(items, tree, strict=True)):
            return tree
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree


def load_run_state(path: str, required: tuple[str, ...] = REQUIRED_KEYS) -> dict[str, Any]:
    """Open a checkpoint file with ``weights_only=True``; every failure is one line naming it.
    ``required``: the keys it must hold."""
    if os.path.islink(path) and not os.path.exists(path):
        raise CheckpointError(
            f"resume: {path} is a dangling link (its target {os.readlink(path)} is gone)"
        )
    if not os.path.isfile(path):
        raise CheckpointError(f"resume: checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's wording: a class not allow-listed, or a callable of a module it blocks
        # (``posix.system``: a checkpoint written to run a command as it loads)
        needs = re.search(r"GLOBAL (\S+) (?:was not an allowed global|whose module \S+ is blocked)",
                          str(exc))  # fmt: skip
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


def restore_tensors(state: dict[str, Any], parts: RunParts) -> None:
    """The gathered model and optimizer state into ``parts``, resharded as the run needs."""
    model_state = clean_state_dict(state["model_state_dict"])
    parts.parallel.load_state(model_state, parts.optimizer, state["optimizer_state_dict"])


def load_full(state: dict[str, Any]) -> dict[str, Any]:
    """The plain file's dict is the full checkpoint already."""
    return state
