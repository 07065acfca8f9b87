"""What a name or a call refers to, from inside one function of the package.

``Scope`` answers the expression evaluator's questions (``rank_values.Resolver``): a dotted
name resolved through locals, enclosing functions, the module's own defs and its imports; the
facts of a free name (a closure's, a module global, a global imported from another module);
what a call gives (a package function's return, with what this call passes for the parameters
it derives from; a class's instance; a DDP or FSDP model; a library's object); which package
functions a call may run (``targets``), and which argument each parameter receives.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from refddp.lint.calls import Function, Package
from refddp.lint.collectives import COLLECTIVE_LIBRARIES, DDP, FSDP1, FULLY_SHARD, UNSYNCED_METRIC
from refddp.lint.rank_values import NOTHING, Evaluator, Facts, Resolver


def library_of(dotted: str | None) -> str | None:
    """The library a dotted name is in, for objects it makes: one of the libraries whose
    methods may communicate ('accelerate', 'torch.distributed', 'lightning'...), or 'library'
    for any other (its methods are taken to issue no collective)."""
    if not dotted or dotted.startswith("builtins."):
        return None
    for lib in (*COLLECTIVE_LIBRARIES, "torchmetrics"):  # a metric: its compute() gathers
        if dotted == lib or dotted.startswith(lib + "."):
            return lib
    return "library"


class Scope(Resolver):
    """Name resolution from inside one function (``rank_values.Resolver``)."""

    def __init__(self, package: Package, function: Function, env: dict[str, Facts],
                 reads: set | None = None):  # fmt: skip
        self.package, self.function = package, function
        self.evaluator = Evaluator(function.module.display, env, self)
        # what the package's facts this function's analysis read: rerun it when they change
        self.reads = reads if reads is not None else set()

    def facts(self, expr: ast.expr) -> Facts:
        return self.evaluator.facts(expr)

    def is_local(self, name: str) -> bool:
        return name in self.function.assigned and name not in self.function.nested

    def dotted(self, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            scope: Function | None = self.function
            while scope is not None and not isinstance(scope.node, ast.Module):
                if expr.id in scope.nested:
                    return scope.nested[expr.id]
                if expr.id in scope.assigned:
                    return None
                scope = scope.parent
            module = self.function.module
            self.reads.add(("glob", module.name))
            if expr.id in self.package.globals.get(module.name, {}) and \
                    not self.package.in_package(f"{module.name}.{expr.id}"):  # fmt: skip
                return None  # a module global variable
            return self.package.module_level(module, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.dotted(expr.value)
            if base is None or base.startswith("builtins."):
                return None
            if base in self.package.functions:
                return None  # an attribute of a function object
            return self.package.canonical(f"{base}.{expr.attr}")
        return None

    def global_facts(self, name: str) -> Facts:
        scope = self.function.parent
        # a closure's free name: the enclosing function's (not the module's: its globals are
        # ``package.globals``, which holds what functions assign through ``global`` too)
        while scope is not None and not isinstance(scope.node, ast.Module):
            self.reads.add(("env", scope.qualname))
            env = self.package.final_env.get(scope.qualname, {})
            if name in env:
                return env[name]
            scope = scope.parent
        module = self.function.module
        self.reads.add(("glob", module.name))
        found = self.package.globals.get(module.name, {}).get(name)
        if found is not None:
            return found
        dotted = self.package.module_level(module, name)
        if dotted in self.package.functions:
            return Facts(functions=frozenset({dotted}))
        if dotted and dotted in self.package.modules:
            return NOTHING
        if dotted and dotted.rpartition(".")[0] in self.package.modules:
            owner = dotted.rpartition(".")[0]  # a global imported from another module
            self.reads.add(("glob", owner))
            return self.package.globals.get(owner, {}).get(dotted.rpartition(".")[2], NOTHING)
        return NOTHING

    def lambda_facts(self, node: ast.Lambda) -> Facts:
        return Facts(functions=frozenset({self.package.lambdas[id(node)]}))

    def returned(self, targets: list[str], call: ast.Call) -> Facts:
        """What calling ``targets`` gives, the parameters their results derive from replaced
        by what this call passes."""
        result = NOTHING
        for target in targets:
            self.reads.add(("ret", target))
            facts = self.package.returns.get(target, NOTHING)
            if facts.params:
                bound = self.bound_args(target, call)
                for param in facts.params:
                    if param in bound:
                        result = result | self.facts(bound[param])
                facts = replace(facts, params=frozenset())
            result = result | facts
        return result

    def call_facts(self, call: ast.Call, callee: Facts, dotted: str | None,
                   args: list[Facts]) -> Facts:  # fmt: skip
        package = self.package
        if dotted is not None:
            if dotted in package.functions:
                return self.returned([dotted], call)
            if dotted in package.classes:  # (the project's own metric, made unsynced)
                return Facts(classes=frozenset({dotted}),
                             library=UNSYNCED_METRIC if _unsynced(call) else None)
            if dotted in DDP:
                return Facts(wrapped="DDP")
            if dotted in FSDP1 or dotted in FULLY_SHARD:
                return Facts(wrapped="FSDP")
            if dotted == "functools.partial" and args:
                return Facts(functions=args[0].functions)
            if dotted == "builtins.super" and self.function.cls:
                return Facts(classes=frozenset(package.bases(self.function.cls)))
            library = library_of(dotted)
            if library == "torchmetrics" and _unsynced(call):
                return Facts(library=UNSYNCED_METRIC)  # its compute() gathers nothing
            return Facts(library=library)
        if callee.functions:
            return self.returned(sorted(callee.functions), call)
        if callee.classes and isinstance(call.func, ast.Name):
            return Facts(classes=callee.classes)  # cls(...): an instance
        if not isinstance(call.func, ast.Attribute):
            return NOTHING
        method = call.func.attr
        receiver = self.facts(call.func.value)
        if receiver.library == "accelerate" and method == "prepare":
            return Facts(wrapped="DDP", library="accelerate")
        if receiver.classes:
            return self.returned(package.methods_named(receiver.classes, method), call)
        if receiver.library:
            return Facts(library=receiver.library)
        return NOTHING

    def attribute_facts(self, base: Facts, name: str) -> Facts:
        """What ``name`` of an instance of ``base``'s package classes holds: what the package
        assigns to it, or what its property's getter returns (``self.main``, say, returning
        ``self.rank == 0``)."""
        if not base.classes:
            return NOTHING
        for cls in base.classes:
            self.reads.update(("attr", member, name) for member in self.package.family(cls))
        found = self.package.attribute(base.classes, name)
        for getter in self.package.properties(base.classes, name):
            self.reads.add(("ret", getter))
            got = self.package.returns.get(getter, NOTHING)
            found = found | replace(got, params=frozenset())  # (its one parameter: self)
        return found

    def targets(self, call: ast.Call) -> tuple[list[str], bool]:
        """The package functions ``call`` may run, and whether the list is a guess by a
        method's name alone (the object's class unknown)."""
        package, func = self.package, call.func
        dotted = self.dotted(func)
        if dotted in package.functions:
            return [dotted], False
        if dotted in package.classes:
            return package.constructor(dotted), False
        if dotted is not None:
            return [], False
        callee = self.facts(func)
        if callee.functions:
            return sorted(callee.functions), False
        if not isinstance(func, ast.Attribute):
            return [], False
        receiver = self.facts(func.value)
        if receiver.classes:
            return package.methods_named(receiver.classes, func.attr), False
        if receiver.library or receiver.wrapped:
            return [], False
        return list(package.methods_by_name.get(func.attr, [])), True

    def bound_args(self, target: str, call: ast.Call) -> dict[str, ast.expr]:
        """Which argument expression of ``call`` each parameter of ``target`` receives."""
        function = self.package.functions[target]
        shift = 1 if function.is_method and (isinstance(call.func, ast.Attribute) or
                                             function.short.endswith(".__init__")) else 0
        bound: dict[str, ast.expr] = {}
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred) or i + shift >= len(function.params):
                break
            bound[function.params[i + shift]] = arg
        for keyword in call.keywords:
            if keyword.arg in function.params:
                bound[keyword.arg] = keyword.value
        return bound


def _unsynced(call: ast.Call) -> bool:
    """``sync_on_compute=False`` written in the call that makes a torchmetrics metric."""
    return any(k.arg == "sync_on_compute" and isinstance(k.value, ast.Constant)
               and k.value.value is False for k in call.keywords)  # fmt: skip
