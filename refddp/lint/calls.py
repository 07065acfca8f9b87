"""The analysed package: its functions and classes, and what a name or a call refers to.

Every ``def`` (methods and nested functions included), every ``lambda`` and each module's
top-level code is a ``Function``, named by a qualified name (``pkg.mod.Class.method``,
``pkg.mod.<module>``, ``pkg.mod.<lambda>:12:8``). ``Package`` resolves a name through the
file's imports to one of them or to a library (``dotted``), and holds what the fixed point of
``dataflow.py`` learns about them across files: what each function returns, what the package
assigns to each attribute name, each module's globals, what callers pass to each parameter.
``Scope`` answers the expression evaluator's questions (``rank_values.Resolver``) from inside
one function.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field, replace

from refddp.lint.collectives import COLLECTIVE_LIBRARIES, DDP, FSDP1, FULLY_SHARD
from refddp.lint.rank_values import NOTHING, Evaluator, Facts, Resolver
from refddp.lint.sources import Module

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.Module


@dataclass(eq=False)
class Function:
    """A body the lint analyses: a def, a lambda, or a module's top-level code."""

    qualname: str
    module: Module
    node: FunctionNode
    cls: str | None = None  # the class a method belongs to
    parent: Function | None = None  # the function a nested def or lambda is in
    params: list[str] = field(default_factory=list)
    assigned: set[str] = field(default_factory=set)  # names bound in the body: locals
    nested: dict[str, str] = field(default_factory=dict)  # nested def name -> qualname
    global_names: set[str] = field(default_factory=set)  # `global x` declarations

    @property
    def is_method(self) -> bool:
        return self.cls is not None and not any(
            isinstance(d, ast.Name) and d.id == "staticmethod"
            for d in getattr(self.node, "decorator_list", []))  # fmt: skip

    @property
    def short(self) -> str:
        return self.qualname.removeprefix(self.module.name + ".")


@dataclass(eq=False)
class Class:
    qualname: str
    module: Module
    bases: list[str]
    methods: dict[str, str] = field(default_factory=dict)


def _params(node: FunctionNode) -> list[str]:
    if isinstance(node, ast.Module):
        return []
    a = node.args
    return [p.arg for p in [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []),
                            *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]]  # fmt: skip


def _bound_names(body: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """Names a body binds (not looking into nested defs, lambdas or classes), and its globals."""
    names: set[str] = set()
    declared: set[str] = set()
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Global):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        stack.extend(ast.iter_child_nodes(node))
    return names - declared, declared


class Package:
    """Every function and class of the analysed files, and the facts learnt about them."""

    def __init__(self, modules: list[Module]):
        self.modules: dict[str, Module] = {}
        for module in modules:  # two scripts of one name: the second is known by its path
            if module.name in self.modules:
                module.name = module.display
            self.modules[module.name] = module
        self.functions: dict[str, Function] = {}
        self.classes: dict[str, Class] = {}
        self.methods_by_name: dict[str, list[str]] = {}
        self.lambdas: dict[int, str] = {}  # id(ast.Lambda) -> qualname
        self.returns: dict[str, Facts] = {}
        self.attributes: dict[tuple[str, str], Facts] = {}  # (class, attribute name) -> facts
        self.globals: dict[str, dict[str, Facts]] = {}
        self.param_facts: dict[str, dict[str, Facts]] = {}
        self.final_env: dict[str, dict[str, Facts]] = {}  # each function's names, all assignments
        self.statement_calls: dict[int, list[ast.Call]] = {}  # the calls each statement makes
        for module in self.modules.values():
            self._index_body(module, module.tree, f"{module.name}.<module>", None, None)
        self._family: dict[str, frozenset[str]] = {}

    def _index_body(self, module: Module, node: FunctionNode, qualname: str,
                    cls: str | None, parent: Function | None) -> Function:  # fmt: skip
        body = node.body if not isinstance(node, ast.Lambda) else [ast.Expr(node.body)]
        function = Function(qualname, module, node, cls, parent, _params(node))
        function.assigned, function.global_names = _bound_names(body)
        function.assigned |= set(function.params)
        self.functions[qualname] = function
        prefix = qualname.removesuffix(".<module>") if isinstance(node, ast.Module) else (
            f"{qualname}.<locals>")
        self._index_children(module, body, prefix, function)
        return function

    def _index_children(self, module: Module, body: list[ast.stmt], prefix: str,
                        function: Function, cls: str | None = None) -> None:  # fmt: skip
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{node.name}"
                stack.extend(d for d in [*node.decorator_list, *node.args.defaults,
                                         *node.args.kw_defaults] if d is not None)
                self._index_body(module, node, name, cls, None if cls else function)
                if cls:
                    self.classes[cls].methods[node.name] = name
                    self.methods_by_name.setdefault(node.name, []).append(name)
                elif not isinstance(function.node, ast.Module):
                    function.nested[node.name] = name
                continue
            if isinstance(node, ast.ClassDef):
                name = f"{prefix}.{node.name}"
                bases = [ast.unparse(b) for b in node.bases]
                self.classes[name] = Class(name, module, bases)
                stack.extend(node.decorator_list)
                self._index_children(module, node.body, name, function, cls=name)
                continue
            if isinstance(node, ast.Lambda):
                name = f"{module.name}.<lambda>:{node.lineno}:{node.col_offset}"
                self.lambdas[id(node)] = name
                self._index_body(module, node, name, None, function)
                continue
            stack.extend(ast.iter_child_nodes(node))

    # -- names --------------------------------------------------------------------------

    def canonical(self, dotted: str) -> str:
        """Follow re-exports: ``pkg.name`` imported into ``pkg/__init__.py`` from ``pkg.mod``."""
        for _ in range(8):
            if dotted in self.functions or dotted in self.classes or dotted in self.modules:
                return dotted
            module, _, name = dotted.rpartition(".")
            if module in self.modules and name in self.modules[module].aliases:
                dotted = self.modules[module].aliases[name]
                continue
            if module in self.classes:  # a class's method
                method = self.classes[module].methods.get(name)
                return method or dotted
            return dotted
        return dotted

    def module_level(self, module: Module, name: str) -> str | None:
        """What a free name in ``module`` names: a def or class of its own, or an import."""
        qualname = f"{module.name}.{name}"
        if qualname in self.functions or qualname in self.classes:
            return qualname
        if name in module.aliases:
            return self.canonical(module.aliases[name])
        if hasattr(builtins, name):
            return f"builtins.{name}"
        return None

    def in_package(self, dotted: str | None) -> bool:
        return dotted is not None and (dotted in self.functions or dotted in self.classes)

    def bases(self, cls: str) -> list[str]:
        """The package classes ``cls`` derives from directly."""
        klass, found = self.classes[cls], []
        for base in klass.bases:
            head = base.partition(".")[0]
            resolved = self.module_level(klass.module, head)
            if resolved:
                qualname = self.canonical(resolved + base[len(head):])
                if qualname in self.classes:
                    found.append(qualname)
        return found

    def methods_named(self, classes: frozenset[str] | set[str], name: str) -> list[str]:
        """``name`` on instances of ``classes``, looked up through the package's own bases."""
        found, seen = [], set()
        todo = list(classes)
        while todo:
            cls = todo.pop()
            if cls in seen or cls not in self.classes:
                continue
            seen.add(cls)
            if name in self.classes[cls].methods:
                found.append(self.classes[cls].methods[name])
            else:
                todo += self.bases(cls)
        return found

    def family(self, cls: str) -> frozenset[str]:
        """``cls``, the package classes it derives from and those deriving from it: where an
        attribute ``self.x`` it reads may have been assigned."""
        if not self._family:
            parents = {c: self.bases(c) for c in self.classes}
            for c in self.classes:
                up, todo = {c}, [c]
                while todo:
                    for b in parents.get(todo.pop(), []):
                        if b not in up:
                            up.add(b)
                            todo.append(b)
                down = {d for d, ps in parents.items() if c in ps}
                self._family[c] = frozenset(up | down)
        return self._family.get(cls, frozenset({cls}))

    def constructor(self, cls: str) -> list[str]:
        return self.methods_named({cls}, "__init__")

    def attribute(self, classes: frozenset[str], name: str) -> Facts:
        result = NOTHING
        for cls in classes:
            for member in self.family(cls):
                result = result | self.attributes.get((member, name), NOTHING)
        return result


def library_of(dotted: str | None) -> str | None:
    """The library a dotted name is in, for objects it makes: one of the libraries whose
    methods may communicate ('accelerate', 'torch.distributed', 'lightning'...), or 'library'
    for any other (its methods are taken to issue no collective)."""
    if not dotted or dotted.startswith("builtins."):
        return None
    for lib in COLLECTIVE_LIBRARIES:
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
        while scope is not None:  # a closure's free name: the enclosing function's
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
            if dotted in package.classes:
                return Facts(classes=frozenset({dotted}))
            if dotted in DDP:
                return Facts(wrapped="DDP")
            if dotted in FSDP1 or dotted in FULLY_SHARD:
                return Facts(wrapped="FSDP")
            if dotted == "functools.partial" and args:
                return Facts(functions=args[0].functions)
            if dotted == "builtins.super" and self.function.cls:
                return Facts(classes=frozenset(package.bases(self.function.cls)))
            return Facts(library=library_of(dotted))
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
        if not base.classes:
            return NOTHING
        self.reads.add(("attr", name))
        return self.package.attribute(base.classes, name)

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
