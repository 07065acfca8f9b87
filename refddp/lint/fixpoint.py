"""The passes over the package's functions, repeated until what they learn settles.

What one function's pass finds depends on the others': what a callee returns, what the package
assigns to an attribute, what callers pass to a parameter, a module's globals. Each function is
passed once, callees before callers (by the names they call, so most returns are known when
needed); each pass records which of these facts it read, and when a pass changes one, only the
functions that read it are passed again. Facts only grow, so this ends; ``MAX_PASSES`` bounds it
all the same.
"""

from __future__ import annotations

import ast
from collections import deque

from refddp.lint.calls import Package
from refddp.lint.dataflow import Flow
from refddp.lint.rank_values import NOTHING, Facts

MAX_PASSES = 12  # per function, on average: past it the facts are taken as they stand


def _union(facts) -> Facts:
    result = NOTHING
    for f in facts:
        result = result | f
    return result


def callees_first(package: Package) -> list[str]:
    """Each module's top-level code first (functions read its globals), then the functions,
    each after the package functions whose names it calls."""
    by_name: dict[str, list[str]] = {}
    for q in package.functions:
        by_name.setdefault(q.rpartition(".")[2], []).append(q)
    calls: dict[str, list[str]] = {}
    for q, function in package.functions.items():
        names = set()
        for node in ast.walk(function.node):
            if isinstance(node, ast.Call):
                func = node.func
                names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
        calls[q] = [c for name in names for c in by_name.get(name, ()) if c != q]
    order: list[str] = []
    done: set[str] = set()
    for root in package.functions:
        stack = [(root, iter(calls[root]))]
        if root in done:
            continue
        done.add(root)
        while stack:
            q, todo = stack[-1]
            nxt = next((c for c in todo if c not in done), None)
            if nxt is None:
                order.append(q)
                stack.pop()
            else:
                done.add(nxt)
                stack.append((nxt, iter(calls[nxt])))
    return sorted(order, key=lambda q: not q.endswith(".<module>"))  # stable: modules first


class Fixpoint:
    """Runs and reruns the passes, folding each one's findings into the package at once."""

    def __init__(self, package: Package):
        self.package = package
        self.flows: dict[str, Flow] = {}
        self.readers: dict[tuple, set[str]] = {}
        self.attribute_writers: dict[tuple[str, str], set[str]] = {}
        self.param_givers: dict[str, set[str]] = {}
        self.global_writers: dict[str, set[str]] = {}  # module -> functions with `global` writes

    def run(self) -> dict[str, Flow]:
        order = callees_first(self.package)
        queue, queued = deque(order), set(order)
        budget = MAX_PASSES * max(len(order), 1)
        while queue and budget:
            q = queue.popleft()
            queued.discard(q)
            budget -= 1
            for key in self.learn(q, Flow(self.package, self.package.functions[q]).run()):
                for reader in self.readers.get(key, ()):
                    if reader not in queued:
                        queue.append(reader)
                        queued.add(reader)
        self.package.passes = len(order) * MAX_PASSES - budget
        return self.flows

    def learn(self, q: str, flow: Flow) -> set[tuple]:
        """Fold one pass into the package's facts; which facts changed."""
        package, old = self.package, self.flows.get(q)
        self.flows[q] = flow
        for key in old.reads if old else ():
            self.readers[key].discard(q)
        for key in flow.reads:
            self.readers.setdefault(key, set()).add(q)
        changed: set[tuple] = set()
        if package.returns.get(q, NOTHING) != flow.returns:
            package.returns[q] = flow.returns
            changed.add(("ret", q))
        if package.final_env.get(q, {}) != flow.final:
            package.final_env[q] = flow.final
            changed.add(("env", q))
        module = flow.function.module.name
        writers = self.global_writers.setdefault(module, set())
        (writers.add if flow.global_writes else writers.discard)(q)
        if q.endswith(".<module>") or flow.global_writes or (old and old.global_writes):
            # the module's top-level code's names, and what its functions assign through
            # ``global`` statements (``IS_MAIN = dist.get_rank() == 0`` in a setup function)
            top = self.flows.get(f"{module}.<module>")
            merged = dict(top.final) if top else {}
            for writer in writers:
                for name, facts in self.flows[writer].global_writes.items():
                    merged[name] = merged.get(name, NOTHING) | facts
            if package.globals.get(module) != merged:
                package.globals[module] = merged
                changed.add(("glob", module))
        for key in (old.attributes.keys() if old else set()) | flow.attributes.keys():
            writers = self.attribute_writers.setdefault(key, set())
            (writers.add if key in flow.attributes else writers.discard)(q)
            merged = _union(self.flows[w].attributes[key] for w in writers)
            if package.attributes.get(key, NOTHING) != merged:
                package.attributes[key] = merged
                changed.add(("attr", *key))
        for target in (old.param_facts.keys() if old else set()) | flow.param_facts.keys():
            givers = self.param_givers.setdefault(target, set())
            (givers.add if target in flow.param_facts else givers.discard)(q)
            merged: dict[str, Facts] = {}
            for giver in givers:
                for param, facts in self.flows[giver].param_facts[target].items():
                    merged[param] = merged.get(param, NOTHING) | facts
            if package.param_facts.get(target, {}) != merged:
                package.param_facts[target] = merged
                changed.add(("param", target))
        return changed
