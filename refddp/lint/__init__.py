"""A static check for collectives that only some ranks reach: ``python -m refddp.lint PATH...``.

The deadlock users lose the most days to is a collective that only some ranks reach: a
``dist.barrier()`` after a rank-0-only save, an ``all_reduce`` inside ``if
is_main_process():``, an early ``return`` on one rank before the next collective, a loop whose
trip count depends on the rank's shard. Following PARCOACH (Saillard, Carribault, Barthou;
EuroMPI 2013), the lint finds rank-dependent values (``rank_values.py``, ``dataflow.py``) and
reports the collectives (``collectives.py``) whose execution depends on them through control
flow (``ir.py``, ``sequences.py``, ``rules.py``), across the package's own call graph
(``calls.py``). Pure ``ast``: nothing linted is imported or run, and torch is not needed.

What it cannot decide (a callback it cannot resolve, a DDP forward) it says so in a note and
leaves to the harness's run-time check (docs/harness.md).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from refddp.lint.calls import Package
from refddp.lint.dataflow import Flow
from refddp.lint.findings import CODES, Finding, suppressed
from refddp.lint.fixpoint import Fixpoint
from refddp.lint.ir import Builder
from refddp.lint.rules import Rules
from refddp.lint.sequences import Sequences
from refddp.lint.sources import LintUsageError, Module, from_tree, load, load_readable
from refddp.lint.turns import Turns

__all__ = ["CODES", "Analysis", "Finding", "LintUsageError", "analyse", "findings",
           "lint_modules", "lint_paths", "lint_readable_paths", "lint_source"]  # fmt: skip

@dataclass
class Analysis:
    """The analysed files: the package index, each function's tree and their sequences."""

    package: Package
    flows: dict[str, Flow]
    trees: dict[str, list]
    sequences: Sequences

    def issues(self, qualname: str) -> str | None:
        """The first collective the package function ``qualname`` may issue, or None."""
        return self.sequences.issues(qualname)


def analyse(modules: list[Module]) -> Analysis:
    """Index, follow the facts to a fixed point (``fixpoint.py``), build every function's
    tree, pair the turns of "rank 0 goes first" (``turns.py``)."""
    package = Package(modules)
    flows = Fixpoint(package).run()
    built = {q: Builder(package.functions[q], flow).build() for q, flow in flows.items()}
    trees = Turns(Sequences(built)).trees(built, {q: package.functions[q].node for q in built})
    return Analysis(package, flows, trees, Sequences(trees))


def lint_modules(modules: list[Module]) -> list[Finding]:
    """Findings and notes for parsed files, analysed together, sorted, suppressions applied."""
    return findings(analyse(modules), modules)


def findings(analysis: Analysis, modules: list[Module]) -> list[Finding]:
    """The rules' findings on an analysis of ``modules``."""
    paths = {q: f.module.display for q, f in analysis.package.functions.items()}
    rules = Rules(analysis.sequences, paths)
    for qualname, tree in analysis.trees.items():
        rules.function(qualname, tree)
    rules.callers(analysis.trees)
    lines = {m.display: m.lines for m in modules}
    return sorted(f for f in rules.findings.values() if not suppressed(f, lines[f.path]))


def lint_paths(paths: list[str]) -> list[Finding]:
    """Lint files and directories together (one package, one call graph); a file that does
    not parse is a ``LintUsageError``."""
    return lint_modules(load(paths))


def lint_readable_paths(paths: list[str]) -> tuple[list[Finding], list[str]]:
    """``lint_paths`` of the files that parse, and one line for each that does not."""
    modules, unreadable = load_readable(paths)
    return lint_modules(modules), unreadable


def lint_source(source: str, path: str = "<source>") -> list[Finding]:
    """Lint one file's text, alone."""
    return lint_modules([from_tree(ast.parse(source, path), path, source.splitlines())])
