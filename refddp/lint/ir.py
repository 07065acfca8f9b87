"""A function's body as the lint sees it: only the calls that matter and the control flow
around them.

The tree keeps, in execution order: collectives and calls of the package's own functions
(``Call``), calls the lint cannot resolve (``Call`` of kind ``unknown`` or ``maybe``: notes
when rank-dependent), ``return`` / ``raise`` / ``break`` / ``continue`` / ``sys.exit``
(``Exit``), branches (``Branch``: ``if``, a ternary, ``and`` / ``or``, ``match``, a
``@rank_zero_only`` decorator) and loops (``Loop``), each with the origin of its
rank-dependence, if any. Everything else (assignments, logging, arithmetic) is dropped.

A ``raise`` inside a ``try`` that has ``except`` clauses is not an exit here: where it lands
cannot be told without types, so the lint keeps it simple and follows the ``try`` body.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from refddp.lint.calls import Function
from refddp.lint.collectives import (
    COLLECTIVE_LIBRARIES,
    DIST_OBJECT_METHODS,
    EXITS,
    SAFE_METHODS,
    TORCHMETRICS_COLLECTIVES,
    Verdict,
    library_call,
    method_call,
)
from refddp.lint.dataflow import Flow
from refddp.lint.rank_values import NOTHING, Facts, Origin
from refddp.lint.scope import Scope

# Decorators that run a function on the main process only (Lightning, Accelerate, others).
RANK_ONLY_DECORATOR = re.compile(r"^(rank_zero_only|rank0_only|on_main_process|"
                                 r"on_local_main_process|main_process_only|master_only)$")


@dataclass(eq=False)
class Call:
    """A call that matters: kind ``collective``, ``package`` (the package's own functions),
    ``maybe`` / ``unknown`` (cannot tell), ``param`` (a call of the function's parameter)."""

    node: ast.expr
    kind: str
    name: str
    scope: Scope
    targets: tuple[str, ...] = ()
    guess: bool = False  # targets found by a method's name alone
    why: str = ""
    group: str | None = None  # a collective on a subgroup (``group=evens``): its members' alone

    @property
    def text(self) -> str:
        return shown(self.node)


@dataclass(eq=False)
class Exit:
    node: ast.AST
    kind: str  # return, raise, break, continue, exit


@dataclass(eq=False)
class Branch:
    node: ast.AST
    text: str  # the condition, as written
    rank: Origin | None
    a: list = field(default_factory=list)
    b: list = field(default_factory=list)
    params: frozenset[str] = frozenset()  # the function's parameters the condition depends on
    membership: bool = False  # the condition tests membership (`rank in members`)
    # an ``and``'s terms that are not rank-dependent (``initialized and rank == 0``; a
    # parameter's, where callers pass such values), as ``ast.dump`` writes them: turns.py pairs
    # such conditions on the rest
    uniform_terms: tuple[str, ...] = ()
    guard_params: frozenset[str] = frozenset()  # the parameters those terms depend on
    turns: tuple[int, int] | None = None  # what runs between two paired turns: their lines


@dataclass(eq=False)
class Loop:
    node: ast.AST
    text: str  # what it iterates over, or its condition
    rank: Origin | None
    body: list = field(default_factory=list)
    orelse: list = field(default_factory=list)
    params: frozenset[str] = frozenset()


@dataclass(eq=False)
class Try:
    body: list
    handlers: list[list]
    orelse: list
    final: list


def shown(node: ast.AST, limit: int = 60) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Builder:
    """Turns one function's body into the tree above, with the facts of its ``Flow``."""

    def __init__(self, function: Function, flow: Flow):
        self.function, self.flow = function, flow
        self.scope = flow.scope({})
        self.no_sync = False

    def build(self) -> list:
        node = self.function.node
        if isinstance(node, ast.Lambda):
            self.scope = self.flow.scope(self._lambda_env())
            return self.expr(node.body)
        body = self.block(node.body, in_try=False)
        for decorator in getattr(node, "decorator_list", []):
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if RANK_ONLY_DECORATOR.match(name):
                origin = Origin(self.function.module.display, decorator.lineno, shown(decorator))
                body = [Branch(decorator, "@" + shown(decorator), origin, body, [])]
        return body

    def _lambda_env(self) -> dict:
        given = self.flow.package.param_facts.get(self.function.qualname, {})
        return {p: given.get(p, NOTHING) | self.flow.entry.get(p, NOTHING)
                for p in self.function.params}  # fmt: skip

    def block(self, body: list[ast.stmt], in_try: bool) -> list:
        nodes: list = []
        for statement in body:
            nodes += self.statement(statement, in_try)
        return nodes

    def statement(self, node: ast.stmt, in_try: bool) -> list:  # noqa: C901
        scope = self.flow.scopes.get(id(node))
        if scope is None:
            return []  # unreachable code the flow never visited
        self.scope = scope
        if isinstance(node, ast.If):
            rank, params = self.depends(node.test)
            test, uniform, guard_params = node.test, (), frozenset()
            if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
                guard = [t for t in test.values if not self.scope.facts(t).rank]
                uniform = tuple(ast.dump(t) for t in guard)
                guard_params = frozenset().union(*(self.scope.facts(t).params for t in guard))
            return [*self.expr(node.test), Branch(node, shown(node.test), rank,
                                                  self.block(node.body, in_try),
                                                  self.block(node.orelse, in_try), params,
                                                  _membership(node.test), uniform,
                                                  guard_params)]  # fmt: skip
        if isinstance(node, ast.For | ast.AsyncFor):  # its trip count: the iterable's length
            rank, params = self.depends(node.iter, length=True)
            return [*self.expr(node.iter), Loop(node, shown(node.iter), rank,
                                                self.block(node.body, in_try),
                                                self.block(node.orelse, in_try), params)]
        if isinstance(node, ast.While):
            rank, params = self.depends(node.test)
            test = self.expr(node.test)
            return [*test, Loop(node, shown(node.test), rank,
                                self.block(node.body, in_try) + test,
                                self.block(node.orelse, in_try), params)]  # fmt: skip
        if isinstance(node, ast.Return):
            return [*self.expr(node.value), Exit(node, "return")] if node.value else [
                Exit(node, "return")]
        if isinstance(node, ast.Raise):
            return [*self.expr(node.exc)] + ([] if in_try else [Exit(node, "raise")])
        if isinstance(node, ast.Break | ast.Continue):
            return [Exit(node, type(node).__name__.lower())]
        if isinstance(node, ast.With | ast.AsyncWith):
            nodes = [n for item in node.items for n in self.expr(item.context_expr)]
            no_sync = any(isinstance(i.context_expr, ast.Call) and isinstance(
                i.context_expr.func, ast.Attribute) and i.context_expr.func.attr == "no_sync"
                for i in node.items)  # fmt: skip
            before, self.no_sync = self.no_sync, self.no_sync or no_sync
            nodes += self.block(node.body, in_try)
            self.no_sync = before
            return nodes
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return [Try(self.block(node.body, in_try or bool(node.handlers)),
                        [self.block(h.body, in_try) for h in node.handlers],
                        self.block(node.orelse, in_try), self.block(node.finalbody, in_try))]
        if type(node).__name__ == "Match":
            rank, params = self.depends(node.subject)
            chain: list = []
            for case in reversed(node.cases):
                chain = [Branch(case, f"match {shown(node.subject)}: case "
                                f"{shown(case.pattern)}", rank, self.block(case.body, in_try),
                                chain, params)]  # fmt: skip
            return [*self.expr(node.subject), *chain]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return []  # run when called: analysed as functions of their own
        return [n for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)
                for n in self.expr(child)]  # fmt: skip

    def depends(self, node: ast.expr, length: bool = False) -> tuple[Origin | None, frozenset]:
        facts = self.scope.facts(node)
        if length and facts.sized:
            return None, frozenset()
        return facts.rank, frozenset() if facts.rank else facts.params

    def expr(self, node: ast.expr | None) -> list:
        """The calls an expression makes, in the order Python evaluates them."""
        if node is None or isinstance(node, ast.Lambda):
            return []
        if isinstance(node, ast.Call):
            nodes = [n for child in [node.func, *node.args, *(k.value for k in node.keywords)]
                     for n in self.expr(child)]  # fmt: skip
            found = self.call(node)
            return nodes + ([found] if found is not None else [])
        if isinstance(node, ast.IfExp):
            rank, params = self.depends(node.test)
            a, b = self.expr(node.body), self.expr(node.orelse)
            branch = [Branch(node, shown(node.test), rank, a, b, params,
                             _membership(node.test))] if a or b else []  # fmt: skip
            return self.expr(node.test) + branch
        if isinstance(node, ast.BoolOp):
            nodes = self.expr(node.values[0])
            for previous, value in zip(node.values, node.values[1:], strict=False):
                inner = self.expr(value)
                if inner:
                    rank, params = self.depends(previous)
                    nodes.append(Branch(node, shown(previous), rank, inner, [], params,
                                        _membership(previous)))  # fmt: skip
            return nodes
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            generators = node.generators
            body = [n for g in generators for c in g.ifs for n in self.expr(c)]
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            body += [n for e in elements for n in self.expr(e)]
            deps = [self.depends(g.iter, length=True) for g in generators]
            rank = next((r for r, _ in deps if r), None)
            params = frozenset() if rank else frozenset().union(*(p for _, p in deps))
            iters = [n for g in generators for n in self.expr(g.iter)]
            return iters + ([Loop(node, shown(generators[0].iter), rank, body, [], params)]
                            if body else [])  # fmt: skip
        return [n for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)
                for n in self.expr(child)]  # fmt: skip

    def call(self, node: ast.Call) -> Call | Exit | None:  # noqa: C901 (one case per callee)
        scope, func = self.scope, node.func
        dotted = scope.dotted(func)
        if dotted in EXITS:
            return Exit(node, "exit")
        callee = scope.facts(func)
        if callee.wrapped:
            return self._forward(node, callee.wrapped)
        if isinstance(func, ast.Name) and func.id in self.function.params:
            return Call(node, "param", func.id, scope)  # checked where it is passed (rules.py)
        targets, guess = scope.targets(node)
        method = func.attr if isinstance(func, ast.Attribute) else None
        metric = scope.facts(func.value) if method in TORCHMETRICS_COLLECTIVES else None
        if metric is not None and self._a_metric(metric):  # made unsynced, or as by default
            verdict = method_call(method, metric.library or "torchmetrics", {})
            return self._verdict(node, verdict) if verdict else None
        if guess and method:
            verdict = method_call(method, None, _keywords(node))
            if verdict is not None:
                return self._verdict(node, verdict)
        if targets:
            name = shown(func, 40)
            return Call(node, "package", name, scope, tuple(targets), guess)
        if dotted is not None:
            if dotted.startswith("builtins."):
                return None
            if dotted == "torch.autograd.backward" and any(
                    scope.facts(a).output for a in node.args):  # fmt: skip
                return self._backward(node)
            return self._verdict(node, library_call(dotted))
        if method is None:
            what = f"{shown(func, 40)}()" if isinstance(func, ast.Name) else shown(node, 40)
            return Call(node, "unknown", what, scope,
                        why=f"a call through {shown(func, 40)}, which the lint cannot resolve")
        receiver = scope.facts(func.value)
        if method == "backward" and receiver.output:
            return None if self.no_sync else self._backward(node)
        if receiver.wrapped == "FSDP" and method == "state_dict":
            return Call(node, "maybe", f"{shown(func, 40)}()", scope,
                        why="an FSDP model's state_dict() gathers parameters")
        library = receiver.library or ("accelerate" if shown(func.value).endswith(
            "accelerator") else None)  # fmt: skip
        verdict = method_call(method, library, _keywords(node))
        if verdict is not None:
            return self._verdict(node, verdict)
        if library == "torch.distributed" and method in DIST_OBJECT_METHODS:
            return None
        if library in COLLECTIVE_LIBRARIES and method not in SAFE_METHODS:
            return Call(node, "unknown", f"{shown(func, 40)}()", scope,
                        why=f"{library}'s {method}() is not in the lint's tables")
        if library or receiver.classes or receiver.wrapped or method in SAFE_METHODS:
            return None
        return Call(node, "unknown", f"{shown(func, 40)}()", scope,
                    why=f"the lint cannot tell what {shown(func.value, 40)} is")

    def _a_metric(self, receiver: Facts) -> bool:
        """An instance of the package's own subclass of a torchmetrics metric: its compute()
        gathers the states as the library's own metrics' does."""
        package = self.flow.package
        return any(b.startswith("torchmetrics.") for c in receiver.classes
                   for b in package.library_bases(c))  # fmt: skip

    def _verdict(self, node: ast.Call, verdict: Verdict) -> Call | Exit | None:
        if verdict.kind == "exit":
            return Exit(node, "exit")
        if verdict.kind == "safe":
            return None
        group = _subgroup(node) if verdict.kind == "collective" else None
        return Call(node, verdict.kind, verdict.name, self.scope, why=verdict.why, group=group)

    def _forward(self, node: ast.Call, wrapped: str) -> Call:
        if wrapped == "FSDP":
            return Call(node, "collective", "FSDP forward", self.scope,
                        why="an FSDP forward all-gathers the parameters")
        return Call(node, "maybe", f"{shown(node.func, 40)}(...)", self.scope,
                    why="a DDP forward broadcasts the module's buffers when it has any "
                    "(broadcast_buffers=True)")

    def _backward(self, node: ast.Call) -> Call:
        return Call(node, "collective", "DDP backward", self.scope,
                    why="the backward of a DDP or FSDP model's loss all-reduces the gradients")


def _membership(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn)
                                                  for op in n.ops) for n in ast.walk(test))


def _subgroup(node: ast.Call) -> str | None:
    """The group a collective names, unless it is the whole world (``group=None``,
    ``dist.group.WORLD``): a subgroup's collective is for its members alone, so a test of
    membership around it is how one writes it (rules.py makes that a note)."""
    for keyword in node.keywords:
        if keyword.arg in ("group", "process_group", "pg"):
            text = shown(keyword.value, 40)
            if isinstance(keyword.value, ast.Constant) or text.endswith("WORLD"):
                return None
            return f"`{text}`"
    return None


def _keywords(node: ast.Call) -> dict[str, object]:
    return {k.arg: k.value.value for k in node.keywords
            if k.arg and isinstance(k.value, ast.Constant)}  # fmt: skip
