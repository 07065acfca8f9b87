"""What callers pass: the checks a function's own walk leaves to its call sites.

Two things a function cannot decide alone. A parameter it calls only on some ranks
(``rank0_then_meet(work)``: ``if rank() == 0: work()``) is fine if what callers pass issues no
collective: each call site is checked (``RDL104``), and a parameter no analysed call passes is
a note. A branch on a parameter (``def f(flag): if flag: dist.barrier()``) is checked like a
rank-dependent one, but its findings wait (``Pending``) until a caller passes a rank-dependent
value for it (``f(rank == 0)``). Both travel up: a caller that passes its own parameter takes
on the obligation, or the pending finding.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from refddp.lint.findings import Finding
from refddp.lint.ir import Branch, Call, Loop, Try, shown
from refddp.lint.rank_values import since

SINCE = "\x00since\x00"  # where a pending finding says why its condition is rank-dependent


@dataclass(frozen=True)
class Pending:
    """A finding that holds where a caller passes a rank-dependent value for ``params``
    (its message, with SINCE where the reason goes, is kept beside it)."""

    params: frozenset[str]
    path: str
    line: int
    col: int
    code: str



class CallerChecks:
    """The call-site half of ``rules.Rules`` (mixed into it: it reports through ``report``)."""

    def callers(self, trees: dict[str, list]) -> None:
        """Check each call of the package's functions against what it passes: a function
        for a parameter called on some ranks only (``RDL104``), a rank-dependent value for
        a parameter a branch depends on (the pending findings)."""
        for _ in range(6):  # both travel up through parameters passed on
            before = ({q: dict(o) for q, o in self.obligations.items()},
                      {q: set(p) for q, p in self.pending.items()})  # fmt: skip
            for qualname, tree in trees.items():
                self.qualname, self.path = qualname, self.paths[qualname]
                for call in package_calls(tree):  # by their class, not a method's name
                    self._passed_functions(call)
                    self._passed_values(call)
            if before == (self.obligations, {q: set(p) for q, p in self.pending.items()}):
                break
        for qualname, params in self.obligations.items():
            for param, (ctx, call) in params.items():
                if (qualname, param) not in self.passed:
                    self.path = self.paths[qualname]
                    name = qualname.rpartition(".")[2]
                    self.report(call.node, "RDL201",
                                f"cannot tell whether {call.text} issues a collective: "
                                f"{param} is a parameter of {name}() and no call of it in the "
                                f"analysed files says what it is; {ctx.runs()} "
                                f"({since(ctx.origin)}): the harness's run-time check covers "
                                "it")  # fmt: skip

    def _passed_values(self, call: Call) -> None:
        for target in call.targets:
            for pending, message in list(self.pending.get(target, {}).items()):
                bound = call.scope.bound_args(target, call.node)
                for param in sorted(pending.params & bound.keys()):
                    arg = bound[param]
                    facts = call.scope.facts(arg)
                    if not facts.rank and not facts.params:
                        continue
                    via = (f"through `{param}`, which {call.text} passes as `{shown(arg, 30)}` "
                           f"at {self.path}:{call.node.lineno}")  # fmt: skip
                    key = (pending.path, pending.line, pending.col, "RDL1")
                    if facts.rank and key not in self.findings:
                        self.findings[key] = Finding(
                            pending.path, pending.line, pending.col, pending.code,
                            message.replace(SINCE, f"{via}, {since(facts.rank)}"))
                    elif facts.params:
                        self.pending.setdefault(self.qualname, {}).setdefault(
                            Pending(facts.params, pending.path, pending.line, pending.col,
                                    pending.code), message.replace(SINCE, f"{via}, {SINCE}"))

    def _passed_functions(self, call: Call) -> None:
        for target in call.targets:
            for param, (ctx, inner) in self.obligations.get(target, {}).items():
                arg = call.scope.bound_args(target, call.node).get(param)
                self.passed.add((target, param))
                if arg is None or isinstance(arg, ast.Constant):
                    continue
                helper = f"{shown(call.node.func, 40)}()"
                where = ctx.runs("") if ctx.turns else f"only where `{ctx.text}`"
                where = f"{where.strip()} ({self.paths[target]}:{inner.node.lineno})"
                if isinstance(arg, ast.Name) and arg.id in call.scope.function.params:
                    self.obligations.setdefault(self.qualname, {}).setdefault(arg.id, (ctx, inner))
                    continue
                functions = self._functions(call.scope, arg)
                issued = [i for i in map(self.seq.issues, functions) if i]
                if issued:
                    self.report(arg, "RDL104",
                                f"{shown(arg, 50)} issues {issued[0]}, and {helper} calls it "
                                f"{where}: " + ("the ranks meet other collectives there"
                                                if ctx.turns else "the other ranks never join "
                                                "it"))  # fmt: skip
                elif not functions:
                    self.report(arg, "RDL201",
                                f"cannot tell whether {shown(arg, 50)} issues a collective: "
                                f"{helper} calls it {where}; the harness's run-time check "
                                "covers it")  # fmt: skip


    @staticmethod
    def _functions(scope, arg: ast.expr) -> list[str]:
        """The package functions an argument may be: a lambda, a function, a bound method."""
        package = scope.package
        dotted = scope.dotted(arg)
        if dotted in package.functions:
            return [dotted]
        found = set(scope.facts(arg).functions)
        if isinstance(arg, ast.Attribute):
            receiver = scope.facts(arg.value)
            if receiver.classes:
                found |= set(package.methods_named(receiver.classes, arg.attr))
        return sorted(found)


def package_calls(nodes: list):
    for node in nodes:
        if isinstance(node, Call) and node.kind == "package" and not node.guess:
            yield node
        elif isinstance(node, Branch):
            yield from package_calls(node.a + node.b)
        elif isinstance(node, Loop):
            yield from package_calls(node.body + node.orelse)
        elif isinstance(node, Try):
            yield from package_calls(node.body + node.orelse + node.final +
                                      [n for h in node.handlers for n in h])  # fmt: skip
