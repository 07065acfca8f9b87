"""One pass over a function's body: the facts of every name before each statement.

Flow-sensitive within a function (``x = rank; x = 0`` leaves ``x`` uniform), with joins where
branches meet and loops walked until nothing changes. Implicit flows count: a name assigned
inside a rank-dependent branch or loop, or after a rank-dependent ``return``, is
rank-dependent (``best = loss`` under ``if rank == 0:``). A collective's output is the same on
every rank: after ``dist.broadcast_object_list(box)`` or ``dist.all_reduce(t)``, ``box`` and
``t`` are uniform again; a scatter's is each rank's own piece (``dist.scatter_object_list(mine,
shards)``: ``mine[0]`` is rank-dependent, ``mine`` as long everywhere).
``fully_shard(model)`` wraps ``model`` in place.

What a pass learns for the whole package (``calls.Package``): the facts of what the function
returns, of the attributes it assigns (explicit flows only: an attribute name is shared by
every object of the package), of the arguments it passes to the package's functions, and, for
a module's top-level code, its globals. ``__init__.analyse`` repeats the passes until these
stop changing.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from refddp.lint.calls import Function, Package
from refddp.lint.collectives import FULLY_SHARD
from refddp.lint.rank_values import HELPER, NOTHING, RANK_NAMES, Facts, Origin, progress_bar_over
from refddp.lint.scope import Scope

Env = dict[str, Facts]
# Collectives whose first argument comes out the same on every rank.
UNIFORM_OUTPUT = frozenset({"broadcast", "broadcast_object_list", "all_reduce", "all_gather",
                            "all_gather_object", "all_gather_into_tensor"})
# Collectives whose first argument comes out as this rank's own piece: as long on every rank
# (a tensor of one shape, a list of one object), its contents rank-dependent.
OWN_PIECE_OUTPUT = frozenset({"scatter", "scatter_object_list", "reduce_scatter",
                              "reduce_scatter_tensor"})


def join(a: Env, b: Env) -> Env:
    if a is b:
        return a
    return {name: a.get(name, NOTHING) | b.get(name, NOTHING) for name in a.keys() | b.keys()}


def returns_early(statement: ast.stmt) -> bool:
    """The statement holds a return or raise: the rest of the function runs on fewer ranks."""
    return any(isinstance(node, ast.Return | ast.Raise) for node in ast.walk(statement))


NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _rewraps(node: ast.stmt, over: ast.expr | None) -> bool:
    """``name = tqdm(name)``: a name rebound to a progress bar over its own value."""
    targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
    return (isinstance(over, ast.Name) and len(targets) == 1
            and isinstance(targets[0], ast.Name) and targets[0].id == over.id)  # fmt: skip


def declared_global(function: ast.AST) -> set[str]:
    """The names ``function``'s own ``global`` statements declare (not a nested function's)."""
    found: set[str] = set()
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Global):
            found.update(node.names)
        elif not isinstance(node, NESTED_SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return found


class Flow:
    """The pass over one function: the names before each statement (its ``Scope``), and what
    it teaches the package."""

    def __init__(self, package: Package, function: Function):
        self.package, self.function = package, function
        self.path = function.module.display
        self.scopes: dict[int, Scope] = {}
        self.returns = NOTHING
        self.final: Env = {}
        self.attributes: dict[tuple[str, str], Facts] = {}
        self.param_facts: dict[str, dict[str, Facts]] = {}
        self.rest_pc: Origin | None = None  # after a rank-dependent exit: the rest of the body
        self.reads: set = {("param", function.qualname)}  # what of the package's facts it used
        # names a ``global`` statement declares here, and what this function assigns to them:
        # the module's globals as every function of it reads them (``fixpoint.Fixpoint``)
        self.global_names = declared_global(function.node)
        self.global_writes: Env = {}
        self.entry: Env = {}

    def run(self) -> Flow:
        function, node = self.function, self.function.node
        env: Env = {}
        given = self.package.param_facts.get(function.qualname, {})
        for i, param in enumerate(function.params):
            # what callers pass, but rank-dependence only as the parameter itself: a caller
            # passing a rank-dependent value is checked at its call (rules.py), so that one
            # caller does not make the function rank-dependent for every other
            facts = replace(given.get(param, NOTHING), rank=None,
                            params=frozenset({param}))  # fmt: skip
            if param in RANK_NAMES or HELPER.match(param):
                facts = facts.ranked(Origin(self.path, node.lineno, f"parameter {param}"))
            elif self.package.spawned.get(function.qualname, (None, -1))[1] == i:
                spawn, _ = self.package.spawned[function.qualname]
                facts = facts.ranked(Origin(self.path, node.lineno, f"parameter {param}, the "
                                            f"process index {ast.unparse(spawn.func)}() passes"))
            if i == 0 and function.is_method:
                facts = facts | Facts(classes=frozenset({function.cls}))
            facts = facts | Facts(classes=self.annotated(param))
            env[param] = facts
        self.entry = dict(env)  # the parameters as the body starts (ir.py reads a lambda's)
        if isinstance(node, ast.Lambda):
            scope = self.scope(env)
            self.returns = scope.facts(node.body)
            self.calls(node.body, scope)
        else:
            self.block(node.body, env, None)
        return self

    def annotated(self, param: str) -> frozenset[str]:
        """The package classes a parameter's annotation names (``trainer: Trainer``,
        ``ctx: DistContext | None``)."""
        node = self.function.node
        if isinstance(node, ast.Module | ast.Lambda):
            return frozenset()
        a = node.args
        arg = next((x for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x.arg == param), None)
        if arg is None or arg.annotation is None:
            return frozenset()
        scope = self.scope({})
        names = [n for n in ast.walk(arg.annotation) if isinstance(n, ast.Name | ast.Attribute)]
        return frozenset(d for d in map(scope.dotted, names) if d in self.package.classes)

    def scope(self, env: Env) -> Scope:
        return Scope(self.package, self.function, env, self.reads)

    def block(self, body: list[ast.stmt], env: Env, pc: Origin | None) -> Env:
        for statement in body:
            env = self.statement(statement, env, pc)
        return env

    def bind(self, target: ast.expr, facts: Facts, env: Env) -> Env:
        if isinstance(target, ast.Name):
            self.final[target.id] = self.final.get(target.id, NOTHING) | facts
            if target.id in self.global_names:
                self.global_writes[target.id] = self.global_writes.get(target.id, NOTHING) | facts
            return {**env, target.id: facts}
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                env = self.bind(element, facts, env)
            return env
        if isinstance(target, ast.Starred):
            return self.bind(target.value, facts, env)
        if isinstance(target, ast.Attribute):  # on objects of known package classes only
            for cls in self.scope(env).facts(target.value).classes:
                key = (cls, target.attr)
                self.attributes[key] = self.attributes.get(key, NOTHING) | facts
            return env
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            name = target.value.id  # box[0] = value: the container holds it now
            merged = env.get(name, NOTHING).ranked(facts.rank)
            self.final[name] = self.final.get(name, NOTHING) | merged
            return {**env, name: merged}
        return env

    def statement(self, node: ast.stmt, env: Env, pc: Origin | None) -> Env:  # noqa: C901
        pc = pc or self.rest_pc
        scope = self.scopes[id(node)] = self.scope(env)  # ir.py evaluates its conditions there
        self.calls(node, scope)
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            if node.value is None:
                return env
            facts = scope.facts(node.value).ranked(pc)
            over = progress_bar_over(node.value, scope.dotted)
            if _rewraps(node, over):  # ``if rank == 0: batches = tqdm(batches)``: the same items
                facts = scope.facts(over)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if isinstance(node, ast.AugAssign):
                facts = facts | scope.facts(node.target)
            if len(targets) == 1 and _pairs(targets[0], node.value):  # a, b = x, y
                for target, value in zip(targets[0].elts, node.value.elts, strict=True):
                    env = self.bind(target, scope.facts(value).ranked(pc), env)
                return env
            for target in targets:
                if isinstance(target, ast.Attribute):  # explicit flows only
                    facts_here = scope.facts(node.value)
                    if isinstance(node, ast.AugAssign):
                        facts_here = facts_here | scope.facts(target)
                    env = self.bind(target, facts_here, env)
                else:
                    env = self.bind(target, facts, env)
            return env
        if isinstance(node, ast.Expr):
            return self.effects(node.value, env)
        if isinstance(node, ast.Return):
            value = scope.facts(node.value) if node.value is not None else NOTHING
            self.returns = self.returns | value.ranked(pc)
            return env
        if isinstance(node, ast.If):
            test = scope.facts(node.test).rank
            inner = pc or test
            after = join(self.block(node.body, env, inner), self.block(node.orelse, env, inner))
            early = self.package.returns_early
            if test and id(node) not in early:
                early[id(node)] = returns_early(node)
            if test and early[id(node)]:
                self.rest_pc = self.rest_pc or test
            return after
        if isinstance(node, ast.For | ast.AsyncFor):
            iterated = scope.facts(node.iter)
            inner = pc or iterated.rank
            return self.loop(node, env, inner, lambda e: self.bind(node.target, iterated.ranked(
                inner), e))  # fmt: skip
        if isinstance(node, ast.While):
            inner = pc or scope.facts(node.test).rank
            return self.loop(node, env, inner, lambda e: e)
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None:
                    env = self.bind(item.optional_vars, scope.facts(item.context_expr).ranked(pc),
                                    env)  # fmt: skip
            return self.block(node.body, env, pc)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            body = self.block(node.body, env, pc)
            joined = join(env, body)
            out = self.block(node.orelse, body, pc)
            for handler in node.handlers:
                out = join(out, self.block(handler.body, joined, pc))
            return self.block(node.finalbody, out, pc)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            qualname = self.function.nested.get(node.name)
            if qualname:
                return self.bind(ast.Name(node.name), Facts(functions=frozenset({qualname})), env)
            return env
        if type(node).__name__ == "Match":
            inner = pc or scope.facts(node.subject).rank
            out = env
            for case in node.cases:
                out = join(out, self.block(case.body, env, inner))
            return out
        return env

    def loop(self, node, env: Env, pc: Origin | None, bind_target) -> Env:
        start = env
        for _ in range(3):  # until the names stop changing (facts only grow)
            body_end = self.block(node.body, bind_target(start), pc)
            widened = join(start, body_end)
            if widened == start:
                break
            start = widened
        return self.block(node.orelse, start, pc)

    def effects(self, expr: ast.expr, env: Env) -> Env:
        """A call's effect on names: ``fully_shard(m)`` wraps m; a collective's first argument
        comes out uniform."""
        if not isinstance(expr, ast.Call) or not expr.args:
            return env
        first = expr.args[0]
        if not isinstance(first, ast.Name):
            return env
        dotted = self.scope(env).dotted(expr.func) or ""
        if dotted in FULLY_SHARD:
            return {**env, first.id: env.get(first.id, NOTHING) | Facts(wrapped="FSDP")}
        collective = dotted.rpartition(".")[2] if dotted.startswith("torch.distributed.") else ""
        if collective in UNIFORM_OUTPUT and first.id in env:
            return {**env, first.id: replace(env[first.id], rank=None, params=frozenset())}
        if collective in OWN_PIECE_OUTPUT:
            piece = Facts(rank=Origin(self.path, expr.lineno, ast.unparse(expr)[:60]), sized=True)
            return {**env, first.id: piece}
        return env

    def calls(self, node: ast.AST, scope: Scope) -> None:
        """What this statement passes to the package's functions, per parameter."""
        cache = self.package.statement_calls
        found = cache.get(id(node))
        if found is None:
            found = cache[id(node)] = list(_calls_in(node))
        for call in found:
            targets, guess = scope.targets(call)
            for target in targets if not guess else ():
                for param, arg in scope.bound_args(target, call).items():
                    facts = scope.facts(arg)
                    if facts != NOTHING:
                        known = self.param_facts.setdefault(target, {})
                        known[param] = known.get(param, NOTHING) | facts


def _pairs(target: ast.expr, value: ast.expr) -> bool:
    """``a, b = x, y``: each name gets its own value."""
    return (isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List)
            and len(target.elts) == len(value.elts)
            and not any(isinstance(e, ast.Starred) for e in [*target.elts, *value.elts]))


def _calls_in(node: ast.AST):
    """The calls a statement makes itself: not those in nested defs, lambdas or sub-blocks."""
    stack = [node]
    while stack:
        current = stack.pop()
        for child in ast.iter_child_nodes(current):
            if isinstance(child, ast.stmt | ast.Lambda | ast.FunctionDef | ast.ClassDef):
                continue
            if isinstance(child, ast.Call):
                yield child
            stack.append(child)
