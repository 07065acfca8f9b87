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

from dataclasses import dataclass

from refddp.lint.calls import Package
from refddp.lint.dataflow import Flow
from refddp.lint.findings import CODES, Finding, suppressed
from refddp.lint.ir import Builder
from refddp.lint.rules import Rules
from refddp.lint.sequences import Sequences
from refddp.lint.sources import LintUsageError, Module, load, parse

__all__ = ["CODES", "Analysis", "Finding", "LintUsageError", "analyse", "findings",
           "lint_paths", "lint_modules"]  # fmt: skip

MAX_ROUNDS = 20  # passes until what functions return, attributes and parameters hold settle


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


def _changed(old: dict, new: dict) -> set:
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


def _learn(package: Package, flows: dict[str, Flow]) -> set:
    """Fold the latest pass of every function into the package's facts; what changed."""
    returns = {q: f.returns for q, f in flows.items()}
    attributes: dict = {}
    params: dict = {}
    for flow in flows.values():
        for key, facts in flow.attributes.items():
            attributes[key] = attributes[key] | facts if key in attributes else facts
        for target, given in flow.param_facts.items():
            known = params.setdefault(target, {})
            for param, facts in given.items():
                known[param] = known[param] | facts if param in known else facts
    globals_ = {f.function.module.name: f.final for q, f in flows.items()
                if q.endswith(".<module>")}  # fmt: skip
    final_env = {q: f.final for q, f in flows.items()}
    changed = ({("ret", q) for q in _changed(package.returns, returns)}
               | {("attr", name) for _, name in _changed(package.attributes, attributes)}
               | {("param", q) for q in _changed(package.param_facts, params)}
               | {("glob", m) for m in _changed(package.globals, globals_)}
               | {("env", q) for q in _changed(package.final_env, final_env)})  # fmt: skip
    package.returns, package.attributes, package.param_facts = returns, attributes, params
    package.globals, package.final_env = globals_, final_env
    return changed


def analyse(modules: list[Module]) -> Analysis:
    """Index, follow the facts to a fixed point, and build every function's tree.

    The first pass runs every function; each later one only those that read a fact the pass
    before changed (what a callee returns, an attribute, a global, a parameter)."""
    package = Package(modules)
    flows = {q: Flow(package, f).run() for q, f in package.functions.items()}
    rerun = set(package.functions)
    for package.rounds in range(1, MAX_ROUNDS + 1):
        changed = _learn(package, flows)
        readers: dict = {}
        for q, flow in flows.items():
            for key in flow.reads:
                readers.setdefault(key, set()).add(q)
        rerun = {q for key in changed for q in readers.get(key, ())}
        if not rerun:
            break
        for q in rerun:
            flows[q] = Flow(package, package.functions[q]).run()
    trees = {q: Builder(package.functions[q], flow).build() for q, flow in flows.items()}
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
    """Lint files and directories together (one package, one call graph)."""
    return lint_modules(load(paths))


def lint_source(source: str, path: str = "<source>") -> list[Finding]:
    """Lint one file's text, alone (what the flake8 plugin and the tests use)."""
    import ast
    from pathlib import Path

    module = Module(Path(path).stem or "source", Path(path), path, ast.parse(source, path),
                    source.splitlines())  # fmt: skip
    from refddp.lint.sources import import_aliases

    module.aliases = import_aliases(module.tree, "")
    return lint_modules([module])


del parse  # re-exported names only above
