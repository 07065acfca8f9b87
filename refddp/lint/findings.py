"""What the lint reports: a finding's codes, its one-line form, and the comment that silences it.

A finding is one line, ``file:line:col: CODE message``, the form compilers, flake8 and ruff use,
so editors and CI annotate it without configuration. ``RDL1xx`` are findings: a collective that
only some ranks reach. ``RDL2xx`` are notes: a call under a rank-dependent condition that the
lint cannot see into; the harness's run-time check covers those, so they never fail a run
unless asked (``--strict``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CODES = {
    "RDL101": "a collective inside a rank-dependent branch (if/elif/else, ternary, and/or) that "
    "the other branch does not match",
    "RDL102": "a collective that ranks skip after a rank-dependent return, break, continue or "
    "raise",
    "RDL103": "a collective in a loop whose trip count is rank-dependent",
    "RDL104": "a function that issues a collective, passed to a helper that runs it on some "
    "ranks only",
    "RDL201": "note: a call under a rank-dependent condition that the lint cannot see into",
}

# `# refddp: ignore` or `# refddp: ignore[RDL101, RDL201]` on the reported line
_IGNORE = re.compile(r"#\s*refddp:\s*ignore(?:\[([A-Z0-9,\s]+)\])?")


@dataclass(frozen=True, order=True)
class Finding:
    """One report: where (1-based line, 0-based column as ``ast`` gives it), which rule, why."""

    path: str
    line: int
    col: int
    code: str
    message: str

    @property
    def is_note(self) -> bool:
        """A note (``RDL2xx``): shown, but not a finding unless ``--strict``."""
        return self.code.startswith("RDL2")

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col + 1}: {self.code} {self.message}"


def suppressed(finding: Finding, lines: list[str]) -> bool:
    """The reported line carries ``# refddp: ignore`` (for every code, or for this one)."""
    if not 0 < finding.line <= len(lines):
        return False
    match = _IGNORE.search(lines[finding.line - 1])
    if match is None:
        return False
    codes = match[1]
    return codes is None or finding.code in {c.strip() for c in codes.split(",")}
