"""``python -m refddp.export CHECKPOINT OUT``: a run's weights, for use outside refddp.

Writes ``OUT.safetensors``: the model's state dict, every key ``model.state_dict()`` has (tied
weights, such as GPT-2's ``lm_head.weight`` and ``transformer.wte.weight``, as two tensors:
safetensors refuses tensors that share memory), with the run's ``config`` (JSON) and ``step``
as metadata. It loads with ``safetensors.torch.load_file`` into the bare model, strict. For a
Hugging Face model (a ``transformers.PreTrainedModel``) also the directory ``OUT/``
(``save_pretrained``), which ``from_pretrained`` loads without network. Either checkpoint
format: a full ``.pth`` file or a ``.dcp`` directory.

Building the model (to learn whether it is a Hugging Face model, and to write its directory)
imports the code its config names (``model: package.module:callable``). Nothing a checkpoint
contains may import code, so, as for the trainer, the user names it (``--model``) or trusts
the checkpoint (``--trust-checkpoint-code``); ``--no-hf`` builds nothing and writes the
safetensors file alone. ``--hf`` requires the directory.

Exit codes: 0 written; 2 bad arguments or input, or a missing optional package (one line);
1 an output that could not be written (one line naming it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from refddp.checkpoints import loading as ckpt
from refddp.checkpoints.run_files import RunFileError, fsync_path, temp_name
from refddp.checkpoints.run_state import check_model_compatible, clean_state_dict
from refddp.config.schema import FIELDS, ConfigError
from refddp.config.validation import refuse_checkpoint_imports
from refddp.workload.models import build_model

EXIT_USAGE, EXIT_RUNTIME = 2, 1
SUFFIX = ".safetensors"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
        raise ConfigError(message)


def export(
    source: str, out: str, model: str | None = None, trust: bool = False, hf: bool | None = None
) -> list[str]:
    """Export the checkpoint ``source`` to ``OUT.safetensors`` and, for a Hugging Face model,
    ``OUT/`` (``hf``: None decides by the model, True requires it, False builds nothing).
    Returns the paths written; every check runs before anything is written."""
    if not os.path.lexists(source):
        raise ConfigError(f"{source}: not found")
    stem = out[: -len(SUFFIX)] if out.endswith(SUFFIX) else out
    _check_output(out, stem)
    save_file = _safetensors_writer()
    if hf and importlib.util.find_spec("transformers") is None:
        raise ConfigError("--hf needs transformers: pip install transformers")
    state = ckpt.load_full_checkpoint(source)  # either format, every tensor read
    config, weights = state["config"], clean_state_dict(state["model_state_dict"])
    spec = None if hf is False else _model_to_build(config, model, trust)
    as_hf = spec is not None and _is_hugging_face(config, spec, weights, source)
    if hf and not as_hf:
        raise ConfigError(
            f"--hf: the model {spec!r} is not a transformers.PreTrainedModel; drop --hf to "
            "write the safetensors file alone"
        )
    if as_hf and os.path.lexists(stem) and not _empty_dir(stem):
        raise ConfigError(f"{stem}: exists; the Hugging Face directory must be new or empty")
    written = [_write_safetensors(weights, config, state["step"], stem + SUFFIX, save_file)]
    if as_hf:
        written.append(_write_hugging_face(config, spec, weights, stem))
    return written


def _check_output(out: str, stem: str) -> None:
    if not os.path.basename(stem):
        raise ConfigError(f"{out}: name the output file (OUT.safetensors), not a directory")
    parent = os.path.dirname(os.path.abspath(stem))
    if not os.path.isdir(parent):
        raise ConfigError(f"{out}: directory {parent} does not exist")
    if os.path.isdir(stem + SUFFIX):
        raise ConfigError(f"{stem + SUFFIX}: is a directory")


def _safetensors_writer() -> Any:
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError("export needs safetensors: pip install 'refddp[export]'") from None
    return save_file


def _model_to_build(config: dict[str, Any], model: str | None, trust: bool) -> str:
    """The model to build: ``--model``, else the checkpoint's, which may name code to import
    only if the user trusts the checkpoint (the trainer's rule)."""
    spec = model or config.get("model", "mlp")
    given = {"model": spec} if model else {}
    try:
        refuse_checkpoint_imports({"model": spec}, {**given, "trust_checkpoint_code": trust})
    except ConfigError:
        raise ConfigError(
            f"model: refused to import {spec!r}: only the checkpoint names it; pass --model "
            f"{spec} or --trust-checkpoint-code to allow it, or --no-hf to write the "
            "safetensors file alone (nothing is built)"
        ) from None
    return spec


def _build(config: dict[str, Any], spec: str) -> nn.Module:
    # Fields this refddp does not know (a checkpoint from another version) build nothing.
    return build_model({**{k: v for k, v in config.items() if k in FIELDS}, "model": spec})


def _is_hugging_face(config: dict[str, Any], spec: str, weights: dict, source: str) -> bool:
    """Whether the model is a ``transformers.PreTrainedModel``, built on the meta device (no
    memory, no initialisation); the checkpoint's weights must fit it."""
    with torch.device("meta"):
        model = _build(config, spec)
    check_model_compatible(model, weights, source)
    # Never imports transformers: a model built from it has imported it already.
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def _empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.listdir(path)


def _write_safetensors(
    weights: dict[str, Any], config: dict[str, Any], step: int, path: str, save_file: Any
) -> str:
    tensors = _unshared(weights, path)
    metadata = {"format": "pt", "config": json.dumps(config, sort_keys=True), "step": str(step)}
    with _atomic(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
        fsync_path(tmp)
    return path


def _unshared(weights: dict[str, Any], path: str) -> dict[str, torch.Tensor]:
    """Every tensor in memory of its own: safetensors refuses tensors that share storage (tied
    weights), and a strict load needs every key, so the second of each tie is a copy."""
    seen: set[int] = set()
    tensors = {}
    for key, value in weights.items():
        if not isinstance(value, torch.Tensor):
            raise ConfigError(
                f"{path}: the model's state entry {key!r} is a {type(value).__name__}, not a "
                "tensor; safetensors holds tensors only"
            )
        storage = value.untyped_storage().data_ptr()
        shared = storage in seen and value.numel() > 0
        seen.add(storage)
        tensors[key] = value.detach().clone() if shared else value.detach().contiguous()
    return tensors


def _write_hugging_face(
    config: dict[str, Any], spec: str, weights: dict[str, Any], directory: str
) -> str:
    """``save_pretrained`` of the model holding the checkpoint's weights, into a temporary
    directory renamed into place: ``OUT/`` is whole or absent."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = _build(config, spec)
    model.load_state_dict(weights, strict=True)  # a tied parameter stays one parameter
    with _atomic(directory) as tmp:
        model.save_pretrained(tmp)
    return directory + os.sep


@contextlib.contextmanager
def _atomic(path: str) -> Iterator[str]:
    """A temporary name beside ``path``, renamed onto it when the block succeeds. A failed
    write is one line naming ``path`` (exit 1) and leaves ``path`` as it was."""
    from safetensors import SafetensorError

    directory, name = os.path.split(os.path.abspath(path))
    tmp = temp_name(os.path.join(directory, "." + name))
    try:
        yield tmp
        _usual_modes(tmp)
        os.replace(tmp, path)
        fsync_path(directory)
    except (OSError, SafetensorError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RunFileError(f"cannot write {path}: {reason.strip().splitlines()[0]}") from None
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)


def _usual_modes(path: str) -> None:
    """Files as ``open`` would have made them: safetensors writes through a private
    temporary file (mode 0600), whatever the umask says."""
    umask = os.umask(0)
    os.umask(umask)
    inside = os.path.isdir(path)
    for name in [os.path.join(path, n) for n in os.listdir(path)] if inside else [path]:
        os.chmod(name, 0o666 & ~umask)


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    parser = _Parser(prog="python -m refddp.export", description=summary)
    parser.add_argument("checkpoint", help="a checkpoint: a .pth file or a .dcp directory")
    parser.add_argument("out", help="writes OUT.safetensors, and the directory OUT/ for a "
                        "Hugging Face model")  # fmt: skip
    parser.add_argument("--model", help="package.module:callable that builds the model "
                        "(default: the checkpoint's; code it names is imported only if given "
                        "here or trusted)")  # fmt: skip
    parser.add_argument("--trust-checkpoint-code", action="store_true",
                        help="import the model code the checkpoint's config names")  # fmt: skip
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=None,
                        help="the Hugging Face directory: required (--hf), never (--no-hf: "
                        "builds nothing), or (default) when the model is a "
                        "transformers.PreTrainedModel")  # fmt: skip
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        written = export(args.checkpoint, args.out, args.model, args.trust_checkpoint_code,
                         args.hf)  # fmt: skip
    except ConfigError as exc:  # CheckpointError too: bad input
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
