"""``--profile START:END``: a ``torch.profiler`` trace of those optimizer steps, per rank.

Each rank writes ``OUT/profile/rankN.json`` (Chrome trace format: chrome://tracing, Perfetto)
with operator input shapes and memory, and each step named ``refddp step K`` in it; on CUDA
also ``rankN_memory.pickle``, a CUDA caching-allocator snapshot of the same steps (open it at
pytorch.org/memory_viz). The profiler starts before step START and stops after step END
(its evaluation and checkpoint included, if it has one); a run that stops earlier writes
what it profiled. Off (the default), the trainer holds no profiler and its loop makes one
check per step.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from refddp.checkpoints.run_files import temp_name, writing
from refddp.config.validation import profile_window

log = logging.getLogger("refddp")
MEMORY_HISTORY_ENTRIES = 100_000  # allocator events kept for the CUDA snapshot


class StepProfiler:
    """Profiles this rank's optimizer steps START..END; ``after_step`` drives it."""

    def __init__(self, spec: str, out: str, rank: int, device: torch.device):
        self.start, self.end = profile_window(spec)
        self.directory = os.path.join(out, "profile")
        self.trace = os.path.join(self.directory, f"rank{rank}.json")
        self.snapshot = os.path.join(self.directory, f"rank{rank}_memory.pickle")
        self.cuda = device.type == "cuda"
        # The allocator's snapshot is documented under private names (pytorch.org/memory_viz).
        memory = getattr(torch.cuda, "memory", None)
        self.snapshots = self.cuda and all(
            hasattr(memory, name) for name in ("_record_memory_history", "_dump_snapshot")
        )
        if self.cuda and not self.snapshots and rank == 0:
            log.warning("profile: this torch (%s) takes no CUDA memory snapshot; writing the "
                        "trace alone", torch.__version__)  # fmt: skip
        self._profile: Any = None
        self._step: Any = None  # the record_function of the step being profiled

    def after_step(self, step: int) -> None:
        """Optimizer step ``step`` (0: none yet) is done: start, label or stop accordingly."""
        if self._profile is None:
            if self.start - 1 <= step < self.end:
                self._begin()
                self._label(step + 1)
            return
        self._step.__exit__(None, None, None)
        if step >= self.end:
            self.finish()
        else:
            self._label(step + 1)

    def _begin(self) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        if self.snapshots:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self._profile = profile(activities=activities, record_shapes=True, profile_memory=True)
        self._profile.__enter__()

    def _label(self, step: int) -> None:
        self._step = record_function(f"refddp step {step}")
        self._step.__enter__()

    def finish(self) -> None:
        """Stop profiling (if it runs) and write the trace (and the CUDA memory snapshot)."""
        if self._profile is None:
            return
        prof, self._profile = self._profile, None
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
        prof.__exit__(None, None, None)
        with writing(self.directory):
            os.makedirs(self.directory, exist_ok=True)
        _write_atomically(self.trace, prof.export_chrome_trace)
        if self.snapshots:
            _write_atomically(self.snapshot, torch.cuda.memory._dump_snapshot)
            torch.cuda.memory._record_memory_history(enabled=None)
        log.info("profile of steps %d-%d written to %s", self.start, self.end, self.trace)


def _write_atomically(path: str, write: Any) -> None:
    """``write(tmp)`` then rename onto ``path``: a reader never sees half a file."""
    tmp = temp_name(path)
    with writing(path):
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
