"""Sharded checkpoints (``--ckpt-format dcp``): every rank writes its own shards, nothing is
gathered to one process.

A dcp checkpoint is one directory, ``checkpoints/checkpoint_stepNNNNNNNN[-K].dcp``, holding:

- the tensors, written by ``torch.distributed.checkpoint`` (DCP): the model's parameters and
  buffers under ``model/FQN`` and the optimizer's state under ``optim/FQN/NAME`` (clean FQNs,
  the full format's model keys). Under FSDP each rank writes its shards; under DDP DCP writes
  each replicated tensor once;
- ``run_state.pth``: everything else a full checkpoint holds (``run_state.build_state``
  without the tensors: step, sampler position, RNG states, scheduler, scaler, config, the
  optimizer's ``param_groups``), plus the parameter order that maps ``optim/FQN`` back to
  the optimizer's indices. A plain file that ``torch.load(weights_only=True)`` opens.

Saved before the optimizer ever stepped (fp16 steps skipped, non-finite losses skipped), a
checkpoint holds no optimizer tensors and says so in its layout (``"optimizer": False``):
DCP's ``get_state_dict`` would otherwise run a real ``optimizer.step()`` (zero gradients,
lr 0) to create the state, and that step changes the run (AdamW's step count).

Atomic like the plain file: every rank writes into a temporary directory, rank 0 adds
``run_state.pth`` last, fsyncs and renames the directory; then ``checkpoint_latest.dcp``
(and ``checkpoint_previous.dcp``, ``checkpoint_best.dcp``) are symbolic links replaced with
``os.replace``, so "latest" only ever names a complete checkpoint. Rank 0 checks that every
shard file the metadata names is there, whole, before the rename (a rank whose ``--out`` is
not shared writes its shards elsewhere), and every load checks it again, so resume falls
back to the previous checkpoint rather than to a half one.

Loading runs no code: DCP reads its ``.metadata`` with a plain ``pickle.load`` and non-tensor
entries with ``torch.load(weights_only=False)`` (torch 2.13). refddp reads the metadata with
an allow-list unpickler (DCP's own metadata classes, torch sizes and dtypes only) and puts no
non-tensor object into DCP; a checkpoint that holds one is refused.

A format of ``refddp/checkpoints/formats.py``; its run state is a plain file of the full format
(``refddp/checkpoints/full.py``), and every file is written through
``refddp/checkpoints/run_files.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import pickle
import re
import shutil
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as _FILESYSTEM
import torch.distributed.checkpoint.metadata as _METADATA
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from refddp.checkpoints import full as checkpoint_full
from refddp.checkpoints import run_files
from refddp.checkpoints.run_files import RunFileError
from refddp.checkpoints.run_state import REQUIRED_KEYS, CheckpointError, RunParts
from refddp.launch.dist import rank0_then_meet

LATEST, PREVIOUS, BEST = (
    "checkpoint_latest.dcp", "checkpoint_previous.dcp", "checkpoint_best.dcp",
)  # fmt: skip
GATHERS_TENSORS = False  # every rank writes its own shards
RUN_STATE = "run_state.pth"
RUN_STATE_KEYS = tuple(k for k in REQUIRED_KEYS if k != "model_state_dict")
KEY = "dcp_checkpoint"  # in a loaded run state: the directory its tensors are in
LAYOUT = "dcp_parameters"  # in run_state.pth: parameter FQNs in the optimizer's index order
_STEP_DIR = re.compile(r"^checkpoint_step\d{8}(-\d+)?\.dcp$")
_TEMP_DIR = re.compile(r"^\.checkpoint_step\d{8}\.dcp\.tmp$")


def owns(path: str) -> bool:
    """A directory (or a link to one) is a dcp checkpoint."""
    return os.path.isdir(path)


def latest(checkpoints: str) -> tuple[str, str]:
    return os.path.join(checkpoints, LATEST), os.path.join(checkpoints, PREVIOUS)


# -- reading without running code -----------------------------------------------------------


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata``, with only the classes DCP's metadata is made of."""

    def find_class(self, module: str, name: str) -> Any:
        # No dotted names: "metadata.torch.load" would reach any function through a module.
        allowed = "." not in name and (
            (module, name) in _ALLOWED
            or (module == _METADATA.__name__ and _defined_in(_METADATA, name))
            # the per-file storage records (``_StorageInfo`` today), plain dataclasses
            or (module == _FILESYSTEM.__name__ and _defined_in(_FILESYSTEM, name)
                and dataclasses.is_dataclass(getattr(_FILESYSTEM, name)))
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name} was not an allowed global")
        return super().find_class(module, name)


def _defined_in(module: Any, name: str) -> bool:
    value = getattr(module, name, None)
    return isinstance(value, type) and value.__module__ == module.__name__


_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(os.path.join(self.path, ".metadata"), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_metadata(path: str) -> Metadata:
    """The checkpoint's DCP metadata; a missing, corrupt or code-carrying one is one line."""
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise CheckpointError(f"{path}: not a dcp checkpoint (no .metadata in it)")
    try:
        metadata = _SafeReader(path).read_metadata()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused: its .metadata needs pickled code to load ({exc})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated, not a pickle, ...: all "corrupt"
        reason = type(exc).__name__
        raise CheckpointError(f"{path}: corrupt dcp .metadata ({reason})") from None
    storage = getattr(metadata, "storage_data", None)
    if not (isinstance(metadata, Metadata) and isinstance(metadata.state_dict_metadata, dict)
            and isinstance(storage, dict)
            and all(isinstance(getattr(info, "offset", None), int)
                    and isinstance(getattr(info, "length", None), int)
                    for info in storage.values())):  # fmt: skip
        raise CheckpointError(f"{path}: corrupt dcp .metadata (not DCP metadata)")
    objects = [k for k, v in metadata.state_dict_metadata.items()
               if not isinstance(v, TensorStorageMetadata)]  # fmt: skip
    if objects:
        raise CheckpointError(
            f"{path}: refused: it holds pickled objects ({', '.join(objects[:3])}), which "
            "refddp does not load"
        )
    return metadata


def _check_complete(path: str, metadata: Metadata) -> None:
    """Every shard file the metadata names is a plain name inside ``path`` and holds its bytes."""
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name
                or "\\" in name or os.sep in name):  # fmt: skip
            raise CheckpointError(
                f"{path}: refused: its .metadata names a shard file outside it ({name!r})"
            )
        if name not in sizes:
            try:
                sizes[name] = os.path.getsize(os.path.join(path, name))
            except OSError:
                raise CheckpointError(
                    f"{path}: incomplete dcp checkpoint: shard file {name} is missing "
                    "(is --out shared by every rank?)"
                ) from None
        if sizes[name] < info.offset + info.length:
            raise CheckpointError(
                f"{path}: incomplete dcp checkpoint: shard file {name} is truncated "
                f"({sizes[name]} bytes, needs {info.offset + info.length})"
            )


def load_run_state(path: str) -> dict[str, Any]:
    """A dcp checkpoint as ``load_checkpoint`` returns a full one, without reading a tensor:
    ``model_state_dict`` holds meta tensors of the saved shapes (enough to check the model
    fits); ``restore`` and ``load_full`` read the tensors.

    A link (``checkpoint_latest.dcp``) is resolved once: the run state and the tensors read
    later come from the same directory even if a live run re-points the link meanwhile."""
    path = os.path.realpath(path)
    metadata = read_metadata(path)
    _check_complete(path, metadata)
    if not os.path.isfile(os.path.join(path, RUN_STATE)):
        raise CheckpointError(f"{path}: not a refddp dcp checkpoint (no {RUN_STATE} in it)")
    state = checkpoint_full.load_run_state(os.path.join(path, RUN_STATE), RUN_STATE_KEYS)
    layout = state.get(LAYOUT)
    if not (isinstance(layout, dict) and isinstance(layout.get("model"), list)
            and isinstance(layout.get("parameters"), list)):  # fmt: skip
        raise CheckpointError(
            f"{path}: not a refddp dcp checkpoint (no parameter layout in its {RUN_STATE})"
        )
    state["model_state_dict"] = {
        key.split("/", 1)[1]: torch.empty(meta.size, dtype=meta.properties.dtype, device="meta")
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model/")
    }
    state[KEY] = path
    return state


def _load_alone(tensors: dict[str, torch.Tensor], reader: FileSystemReader) -> None:
    """``dcp.load`` in this process alone, even where a process group is up (init_from on rank
    0): its ``no_dist`` option is torch >= 2.6; before, the older ``load_state_dict`` has it."""
    if "no_dist" in inspect.signature(dcp.load).parameters:
        dcp.load(tensors, storage_reader=reader, no_dist=True)
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # deprecated in favour of load
        dcp.load_state_dict(tensors, storage_reader=reader, no_dist=True)


def load_full(state: dict[str, Any]) -> dict[str, Any]:
    """The full-format checkpoint of a dcp run state, read in this process alone (no process
    group, any world size): the plain dict a ``checkpoint_latest.pth`` would hold."""
    path = state[KEY]
    metadata = read_metadata(path)
    tensors = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        try:
            _load_alone(tensors, _SafeReader(path))
        except CheckpointException as exc:
            raise CheckpointError(f"{path}: cannot read its tensors ({_first(exc)})") from None
        except Exception as exc:  # noqa: BLE001 - a corrupt shard file: one line, not a traceback
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{path}: cannot read its tensors ({reason})") from None
    try:
        return _assemble(state, tensors)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: its {RUN_STATE} does not match its tensors ({type(exc).__name__}: {exc})"
        ) from None


def _assemble(state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    full = {k: v for k, v in state.items() if k not in (KEY, LAYOUT)}
    full["model_state_dict"] = {
        key.split("/", 1)[1]: tensors[key] for key in state[LAYOUT]["model"]
    }
    index = {name: i for i, name in enumerate(state[LAYOUT]["parameters"])}
    optim: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim/"):
            fqn, name = key[len("optim/") :].rsplit("/", 1)
            optim.setdefault(index[fqn], {})[name] = value
    full["optimizer_state_dict"] = {
        "state": dict(sorted(optim.items())),
        "param_groups": state["optimizer_state_dict"]["param_groups"],
    }
    return full


# -- every rank: its shards -----------------------------------------------------------------


def _sharded(
    parallel: Any, optimizer: torch.optim.Optimizer, with_optimizer: bool = True
) -> tuple[dict, dict]:
    """This rank's model and optimizer state (DTensor shards under FSDP), keyed by clean FQN.

    ``with_optimizer=False``: the model's only. DCP's ``get_state_dict`` creates a missing
    optimizer state by running ``optimizer.step()`` (zero gradients, lr 0), which changes the
    run (AdamW's step count): an optimizer that has not stepped yet is never handed to it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if not with_optimizer:
        return get_model_state_dict(parallel.model), {"state": {}}
    return get_state_dict(parallel.model, optimizer)


def _flat(model_state: dict[str, Any], optim_state: dict[str, Any]) -> dict[str, Any]:
    flat = {f"model/{k}": v for k, v in model_state.items()}
    for fqn, values in optim_state["state"].items():
        flat.update({f"optim/{fqn}/{name}": v for name, v in values.items()})
    return flat


def write(state: dict[str, Any], parts: RunParts, out: str, is_best: bool) -> str | None:
    """Save a dcp checkpoint: a collective, every rank calls it with the same ``state`` (a
    ``build_state(..., tensors=False)``); rank 0 writes the run state and the links."""
    directory = run_files.checkpoint_dir(out)
    tmp = os.path.join(directory, f".checkpoint_step{state['step']:08d}.dcp.tmp")
    rank0_then_meet(lambda: _prepare(directory))
    stepped = bool(parts.optimizer.state)  # the same on every rank: all step together
    model_state, optim_state = _sharded(parts.parallel, parts.optimizer, stepped)
    try:
        dcp.save(_flat(model_state, optim_state),
                 storage_writer=FileSystemWriter(tmp, sync_files=True))  # fmt: skip
    except CheckpointException as exc:  # every rank gets it
        raise RunFileError(f"cannot write checkpoint {tmp} ({_first(exc)})") from None
    names = [name for name, _ in parts.parallel.model.named_parameters()]
    layout = {"model": [f"model/{k}" for k in model_state], "parameters": names,
              "optimizer": stepped}  # fmt: skip
    return rank0_then_meet(lambda: _publish({**state, LAYOUT: layout}, directory, tmp, is_best))


def _first(exc: CheckpointException) -> str:
    """The first failed rank and its error, in a few words."""
    rank, (error, _) = next(iter(exc.failures.items()))
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return f"rank {rank}: " + (reason.strip().splitlines()[0] if reason.strip() else repr(error))


def _prepare(directory: str) -> None:
    with run_files.writing(directory):
        os.makedirs(directory, exist_ok=True)
        run_files.remove_stale_temp_files(directory)
        for name in os.listdir(directory):  # a temporary directory is only ever a dead one's
            if _TEMP_DIR.match(name):
                shutil.rmtree(os.path.join(directory, name))


def _publish(state: dict[str, Any], directory: str, tmp: str, is_best: bool) -> str:
    """Rank 0: complete the checkpoint, rename it into place, point the links at it."""
    try:
        _check_complete(tmp, read_metadata(tmp))
    except CheckpointError as exc:  # not renamed: latest keeps naming a complete one
        raise RunFileError(f"cannot complete checkpoint {exc}") from None
    run_files.save_atomic(state, os.path.join(tmp, RUN_STATE))
    step, n = f"checkpoint_step{state['step']:08d}", 0
    final = os.path.join(directory, f"{step}.dcp")
    while os.path.exists(final):  # the same step saved again (a pending evaluation, say)
        n += 1
        final = os.path.join(directory, f"{step}-{n}.dcp")
    with run_files.writing(f"checkpoint {final}"):
        os.rename(tmp, final)
        latest = os.path.join(directory, LATEST)
        if os.path.islink(latest):
            _point(os.path.join(directory, PREVIOUS), os.readlink(latest))
        _point(latest, os.path.basename(final))
        if is_best:
            _point(os.path.join(directory, BEST), os.path.basename(final))
        _remove_unlinked(directory)
        run_files.fsync_path(directory)
    return latest


def _point(link: str, target: str) -> None:
    tmp = run_files.temp_name(link)
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def forget(checkpoints: str, keep: tuple[str, ...] = ()) -> None:
    run_files.remove_names(checkpoints, [n for n in (LATEST, PREVIOUS, BEST) if n not in keep])
    with run_files.writing(checkpoints):
        if os.path.isdir(checkpoints):
            _remove_unlinked(checkpoints)  # the step directories the links named


def _remove_unlinked(directory: str) -> None:
    """Delete step directories no link names any more (older checkpoints)."""
    kept = {os.readlink(os.path.join(directory, link)) for link in (LATEST, PREVIOUS, BEST)
            if os.path.islink(os.path.join(directory, link))}  # fmt: skip
    for name in os.listdir(directory):
        if _STEP_DIR.match(name) and name not in kept:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def restore_tensors(state: dict[str, Any], parts: RunParts) -> None:
    """Read the model and optimizer tensors of a dcp checkpoint into ``parts``: a collective.
    DCP reads each rank's own shards, resharding when the world size changed."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    stepped = state[LAYOUT].get("optimizer", True)
    model_state, optim_state = _sharded(parts.parallel, parts.optimizer, stepped)
    try:
        dcp.load(_flat(model_state, optim_state), storage_reader=_SafeReader(state[KEY]))
    except CheckpointException as exc:  # every rank gets it
        reason = _first(exc)
        raise CheckpointError(f"{state[KEY]}: cannot read its tensors ({reason})") from None
    if not stepped:  # saved before the first optimizer step: no optimizer state to load
        set_model_state_dict(parts.parallel.model, model_state)
        groups = state["optimizer_state_dict"]["param_groups"]
        parts.optimizer.load_state_dict({"state": {}, "param_groups": groups})
        return
    names = [name for name, _ in parts.parallel.model.named_parameters()]
    groups = [{**g, "params": [names[i] for i in g["params"]]}
              for g in state["optimizer_state_dict"]["param_groups"]]  # fmt: skip
    optim = {"state": optim_state["state"], "param_groups": groups}
    set_state_dict(parts.parallel.model, parts.optimizer, model_state_dict=model_state,
                   optim_state_dict=optim)  # fmt: skip
