"""The checkpoint formats, and the one place that picks one.

``--ckpt-format`` takes its choices from ``FORMATS``. Whatever writes, finds or reads a
checkpoint asks this module for the format (``named`` for a save, ``owning`` for a path,
``every`` for resume's search) and calls the ``CheckpointFormat`` interface on it; nothing
else tells one format from another. Adding a format is one module that implements the
interface and one line in ``FORMATS``.

The format modules are imported by name, when first asked for: they import
``refddp.config.schema`` (a ``CheckpointError`` is a ``ConfigError``), which imports this module for
its choices, so this module imports nothing of refddp's
(``tests/project/test_import_graph.py`` checks that no refddp module imports another back).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, cast

FORMATS = {  # --ckpt-format NAME: the module that writes and reads it
    "full": "refddp.checkpoints.full",  # first: the plain file, for any path no other owns
    "dcp": "refddp.checkpoints.dcp",
}
NAMES = tuple(FORMATS)


class CheckpointFormat(Protocol):
    """What a checkpoint format module provides (module-level names).

    ``state`` is a run state as ``refddp.checkpoints.run_state.build_state`` makes it and
    ``parts`` a ``refddp.checkpoints.run_state.RunParts`` (typed ``Any`` here: this module
    imports no refddp module).
    """

    LATEST: str  # the names of its latest, previous and best checkpoint in checkpoints/
    PREVIOUS: str
    BEST: str
    # True: build_state gathers the model and optimizer tensors into the state write() saves;
    # False: the state holds neither, and write() saves every rank's own shards.
    GATHERS_TENSORS: bool

    def owns(self, path: str) -> bool:
        """Whether ``path`` is a checkpoint of this format (the plain file: any path)."""
        ...

    def latest(self, checkpoints: str) -> tuple[str, str]:
        """The paths of its latest checkpoint in ``checkpoints`` and of the one before."""
        ...

    def write(self, state: dict[str, Any], parts: Any, out: str, is_best: bool) -> str | None:
        """Save ``state`` as the run ``out``'s latest checkpoint (and best): every rank calls
        it; the latest's path on rank 0."""
        ...

    def forget(self, checkpoints: str, keep: tuple[str, ...] = ()) -> None:
        """Remove its latest, previous and best checkpoints in ``checkpoints`` but those named
        in ``keep``: on one process, after a fresh run's first save (``forget_earlier_run``)."""
        ...

    def load_run_state(self, path: str) -> dict[str, Any]:
        """The checkpoint at ``path``, as ``restore`` takes it; every problem one line."""
        ...

    def restore_tensors(self, state: dict[str, Any], parts: Any) -> None:
        """The loaded checkpoint's model and optimizer tensors into ``parts``: every rank."""
        ...

    def load_full(self, state: dict[str, Any]) -> dict[str, Any]:
        """The loaded checkpoint as the plain file's dict, read in this process alone."""
        ...


def named(name: str) -> CheckpointFormat:
    """The format ``--ckpt-format name`` selects."""
    return cast(CheckpointFormat, importlib.import_module(FORMATS[name]))


def every() -> list[CheckpointFormat]:
    """Every format, the plain file first."""
    return [named(name) for name in NAMES]


def plain() -> CheckpointFormat:
    """The plain file: the format every checkpoint converts to."""
    return named(NAMES[0])


def forget_earlier_run(written: CheckpointFormat, checkpoints: str, is_best: bool) -> None:
    """After a fresh run's first checkpoint (``written``'s) is in place: remove every format's
    latest, previous and best that an earlier run in the same ``--out`` left, so that none is
    taken for this run's (a resume's fallback from a damaged latest to the previous one, into
    which that first save moved the earlier run's latest; ``checkpoint_best``; another
    format's latest at a later step). Only then: a fresh run killed before its first save
    leaves the earlier run's checkpoints as they were."""
    for fmt in every():
        keep = () if fmt is not written else (fmt.LATEST, *([fmt.BEST] if is_best else []))
        fmt.forget(checkpoints, keep)


def owning(path: str) -> CheckpointFormat:
    """The format of the checkpoint at ``path``. The plain file is asked last and owns any
    path, so a missing, dangling or damaged one gets its loader's one-line error."""
    first, *others = every()
    return next(f for f in (*others, first) if f.owns(path))
