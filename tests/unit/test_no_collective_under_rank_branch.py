"""Static check: refddp never issues a collective inside a rank-conditional branch.

A collective that only some ranks reach is the classic DDP deadlock (a barrier after a rank-0
progress bar or checkpoint save). This walks refddp's source: inside any ``if`` whose
condition mentions a rank, no call may issue a collective, whether directly
(``dist.all_reduce``) or through one of refddp's helpers that do.
"""

import ast
from pathlib import Path

import refddp
from refddp.testing.collectives import _COLLECTIVES

# refddp functions that issue collectives themselves (checked by the multiproc order tests).
COLLECTIVE_HELPERS = {
    "agree_any",
    "rank0_then_meet",
    "sync_buffers",
    "evaluate",
    "evaluate_and_record",
    "save",
    "run_eval",
    "run_predict",
    "fit",
    "destroy_process_group",
    "new_group",
}
CALLS = set(_COLLECTIVES) | COLLECTIVE_HELPERS
RANK_WORDS = ("rank", "is_main")


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def rank_conditional_collectives(source: str, filename: str = "<src>") -> list[str]:
    findings = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.If | ast.IfExp):
            continue
        condition = ast.unparse(node.test)
        if not any(word in condition for word in RANK_WORDS):
            continue
        branches = node.body + node.orelse if isinstance(node, ast.If) else [node.body, node.orelse]
        for branch in branches:
            for inner in ast.walk(branch):
                if isinstance(inner, ast.Call) and _called_name(inner) in CALLS:
                    findings.append(
                        f"{filename}:{inner.lineno}: {ast.unparse(inner.func)}() under "
                        f"`if {condition}`"
                    )
    return findings


def test_refddp_has_no_collective_inside_a_rank_conditional_branch():
    root = Path(refddp.__file__).parent
    findings = []
    for path in sorted(root.rglob("*.py")):
        findings += rank_conditional_collectives(path.read_text(), str(path.relative_to(root)))
    assert findings == []


def test_the_check_catches_the_progress_bar_barrier():
    planted = """
if dist.get_rank() == 0:
    bar.close()
    dist.barrier()
if ctx.is_main:
    log.info("saved")
else:
    agree_any(True)
x = trainer.save() if rank == 0 else None
"""
    found = rank_conditional_collectives(planted)
    assert [f.split(": ", 1)[1] for f in found] == [
        "dist.barrier() under `if dist.get_rank() == 0`",
        "agree_any() under `if ctx.is_main`",
        "trainer.save() under `if rank == 0`",
    ]


# Code that runs on rank 0 alone (the trackers), or on each rank at its own pace (the
# profiler): no collective anywhere in it, not only under a rank check.
RANK_ALONE = ("trackers", "profiler.py")


def collective_calls(source: str, filename: str = "<src>") -> list[str]:
    return [
        f"{filename}:{node.lineno}: {ast.unparse(node.func)}()"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and _called_name(node) in CALLS
    ]


def test_trackers_and_the_profiler_issue_no_collective_at_all():
    root = Path(refddp.__file__).parent
    paths = [p for name in RANK_ALONE for p in sorted((root / name).glob("**/*.py"))
             or [root / name]]  # fmt: skip
    assert len(paths) >= 5, paths  # the package's modules and profiler.py
    findings = []
    for path in paths:
        findings += collective_calls(path.read_text(), str(path.relative_to(root)))
    assert findings == []
    assert collective_calls("self.trackers.record(r)\ndist.all_reduce(t)\n") == [
        "<src>:2: dist.all_reduce()"
    ]
