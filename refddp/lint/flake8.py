"""The lint as a flake8 plugin: ``flake8 --select RDL`` reports the same ``RDL`` codes.

flake8 hands a plugin one file at a time, so here the call graph is that file's own: a
collective reached through a function of another module is found by ``python -m
refddp.lint`` and ``pytest --dist-lint``, which read the package as a whole. Registered
through the ``flake8.extension`` entry point (``RDL = refddp.lint.flake8:Plugin``); flake8's
``# noqa: RDL101`` works, as does ``# refddp: ignore``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from refddp.lint import lint_modules
from refddp.lint.sources import from_tree


class Plugin:
    """flake8's AST plugin interface: ``name``, ``version``, ``__init__(tree, filename)``,
    ``run()`` yielding ``(line, col, "CODE message", type)``."""

    name = "refddp-lint"
    version = "0.1.0"

    def __init__(self, tree: ast.Module, filename: str = "<stdin>", lines: list[str] | None = None):
        self.tree, self.filename = tree, filename
        self.lines = lines

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        lines = self.lines
        if lines is None:
            try:
                lines = Path(self.filename).read_text().splitlines()
            except OSError:
                lines = []
        module = from_tree(self.tree, self.filename, [line.rstrip("\n") for line in lines])
        for finding in lint_modules([module]):
            yield finding.line, finding.col, f"{finding.code} {finding.message}", type(self)
