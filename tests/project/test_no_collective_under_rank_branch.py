"""Static check: refddp issues no collective that only some ranks reach.

A collective that only some ranks reach is the classic DDP deadlock (a barrier after a rank-0
progress bar or checkpoint save). refddp's own source goes through the lint users get
(``python -m refddp.lint``): rank-dependent values followed across modules, every collective
under a rank-dependent branch, after a rank-dependent return, or in a rank-dependent loop,
whether issued directly or through one of refddp's functions that issue one
(``rank0_then_meet``, ``agree_any``, ``Trainer.save``...), and every function handed to
``rank0_then_meet``, which runs it on rank 0 alone.
"""

import functools
from pathlib import Path

import refddp
from refddp.lint import analyse, findings, lint_paths
from refddp.lint.sources import load

PACKAGE = Path(refddp.__file__).parent


@functools.cache
def refddp_analysed():
    modules = load([str(PACKAGE)])
    return analyse(modules), modules


def test_refddp_has_no_collective_that_only_some_ranks_reach():
    assert [str(f) for f in findings(*refddp_analysed())] == []  # nor a note


def test_the_check_catches_the_progress_bar_barrier(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("""
import torch.distributed as dist
from refddp.launch.dist import agree_any, rank0_then_meet
from refddp.training.trainer import Trainer


def epoch_end(bar, ctx, trainer: Trainer):
    if dist.get_rank() == 0:
        bar.close()
        dist.barrier()
    if ctx.is_main:
        print("saved")
    else:
        agree_any(True)
    x = trainer.save() if ctx.rank == 0 else None
    rank0_then_meet(lambda: agree_any(False))
    return x
""")
    found = lint_paths([str(PACKAGE), str(planted)])
    assert [(f.line, f.code, f.message.split(" (")[0]) for f in found] == [
        (10, "RDL101", "dist.barrier() under `dist.get_rank() == 0`"),
        (14, "RDL101", "agree_any(True), which issues dist.all_reduce, where `ctx.is_main` is "
                       "false"),
        (15, "RDL101", "trainer.save(), which issues dist.broadcast, under `ctx.rank == 0`"),
        (16, "RDL104", "lambda: agree_any(False) issues dist.all_reduce, and rank0_then_meet() "
                       "calls it only where `rank() == 0`"),
    ]


# Code that runs on rank 0 alone (the trackers), or on each rank at its own pace (the
# profiler): no collective anywhere in it, not only under a rank check.
RANK_ALONE = ("training/trackers", "training/profiler.py")


def issuing(modules: list[Path], analysis) -> dict[str, str]:
    """Each function of ``modules`` that may issue a collective (through any call the lint
    resolves), and the first one it issues."""
    wanted = {p.resolve() for p in modules}
    return {q: analysis.issues(q) for q, f in analysis.package.functions.items()
            if f.module.path.resolve() in wanted and analysis.issues(q)}  # fmt: skip


def test_trackers_and_the_profiler_issue_no_collective_at_all(tmp_path):
    paths = [p for name in RANK_ALONE for p in sorted((PACKAGE / name).glob("**/*.py"))
             or [PACKAGE / name]]  # fmt: skip
    assert len(paths) >= 5, paths  # the package's modules and profiler.py
    assert issuing(paths, refddp_analysed()[0]) == {}
    tracker = tmp_path / "tracker.py"
    tracker.write_text("import torch.distributed as dist\nfrom refddp.launch.dist import agree_any\n\n\n"
                       "class Tracker:\n    def record(self, r):\n        self.flush(r)\n\n"
                       "    def flush(self, r):\n        agree_any(r)\n")  # fmt: skip
    assert issuing([tracker], analyse(load([str(PACKAGE), str(tracker)]))) == {
        "tracker.Tracker.record": "dist.all_reduce", "tracker.Tracker.flush": "dist.all_reduce"}
