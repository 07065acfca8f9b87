"""The analysed package: its functions and classes, and what a name or a call refers to.

Every ``def`` (methods and nested functions included), every ``lambda`` and each module's
top-level code is a ``Function``, named by a qualified name (``pkg.mod.Class.method``,
``pkg.mod.<module>``, ``pkg.mod.<lambda>:12:8``). ``Package`` resolves a module-level name
through the file's imports to one of them or to a library, and holds what the passes of
``dataflow.py`` learn about them across files (``fixpoint.py``): what each function returns,
what the package assigns to each attribute of each class, each module's globals, what callers
pass to each parameter. From inside one function, ``scope.py`` resolves the rest.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

from refddp.lint.rank_values import NOTHING, Facts
from refddp.lint.sources import Module

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.Module
# what starts processes with a function whose first argument is the process's index
SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                      "torch.multiprocessing.spawn.spawn",
                      "torch.multiprocessing.spawn.start_processes"})


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

    @property
    def is_property(self) -> bool:
        """A getter read as an attribute: ``@property`` or ``@functools.cached_property``."""
        return self.cls is not None and any(
            (d.id if isinstance(d, ast.Name) else getattr(d, "attr", None))
            in ("property", "cached_property")
            for d in getattr(self.node, "decorator_list", []))  # fmt: skip


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


def _accessor(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """"setter" or "deleter" for ``@name.setter`` / ``@name.deleter``, else None."""
    for d in node.decorator_list:
        if isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter"):
            return d.attr
    return None


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
        self.returns_early: dict[int, bool] = {}  # an `if` holds a return or raise
        for module in self.modules.values():
            self._index_body(module, module.tree, f"{module.name}.<module>", None, None)
        self._family: dict[str, frozenset[str]] = {}
        # a function torch.multiprocessing starts ranks with -> the call, and which of its
        # parameters is the process index, whatever its name (``def main_worker(gpu, ...)``)
        self.spawned: dict[str, tuple[ast.Call, int]] = {}
        for function in list(self.functions.values()):
            self._find_spawned(function)

    def _find_spawned(self, function: Function) -> None:
        for node in _own_calls(function.node):
            if self._dotted(function.module, node.func) not in SPAWNERS:
                continue
            fn = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg == "fn"), None)  # fmt: skip
            index = 0
            while isinstance(fn, ast.Call) and fn.args and self._dotted(
                    function.module, fn.func) == "functools.partial":  # fmt: skip
                index += len(fn.args) - 1  # partial(worker, cfg): the index comes after cfg
                fn = fn.args[0]
            target = self._spawned_function(function, fn) if fn is not None else None
            if target is not None:
                target, bound = target
                self.spawned.setdefault(target, (node, index + bound))

    def _spawned_function(self, function: Function, fn: ast.expr) -> tuple[str, int] | None:
        """The package function ``fn`` names in ``function`` (a def, a nested def, a module's
        attribute, a class's static method, ``self.method``, a lambda), and how many of its
        parameters come before the index (1 for a bound method's self)."""
        if isinstance(fn, ast.Lambda):
            return (self.lambdas[id(fn)], 0) if id(fn) in self.lambdas else None
        if isinstance(fn, ast.Name):
            scope: Function | None = function
            while scope is not None:
                if fn.id in scope.nested:
                    return scope.nested[fn.id], 0
                scope = scope.parent
        if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and \
                fn.value.id == "self" and function.cls:  # fmt: skip
            found = self.methods_named({function.cls}, fn.attr)
            return (found[0], 1) if found else None
        dotted = self._dotted(function.module, fn)
        target = self.canonical(dotted) if dotted else None
        return (target, 0) if target in self.functions else None

    def _dotted(self, module: Module, node: ast.expr) -> str | None:
        """A module-level dotted name's target (``mp.spawn``: torch.multiprocessing.spawn)."""
        if isinstance(node, ast.Attribute):
            head = self._dotted(module, node.value)
            return f"{head}.{node.attr}" if head else None
        return self.module_level(module, node.id) if isinstance(node, ast.Name) else None

    def _index_body(self, module: Module, node: FunctionNode, qualname: str,
                    cls: str | None, parent: Function | None) -> Function:  # fmt: skip
        body = node.body if not isinstance(node, ast.Lambda) else [ast.Expr(node.body)]
        function = Function(qualname, module, node, cls, parent, _params(node))
        self.functions[qualname] = function
        prefix = qualname.removesuffix(".<module>") if isinstance(node, ast.Module) else (
            f"{qualname}.<locals>")
        self._index_children(module, body, prefix, function)
        function.assigned = (function.assigned - function.global_names) | set(function.params)
        return function

    def _index_children(self, module: Module, body: list[ast.stmt], prefix: str,
                        function: Function, cls: str | None = None) -> None:  # fmt: skip
        """Index the defs, classes and lambdas in ``body``; outside a class body, note the
        names it binds (its locals) and declares global."""
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if cls is None:
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                    function.assigned.add(node.id)
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    function.assigned.add(node.name)
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    function.assigned.add(node.name)
                elif isinstance(node, ast.Global):
                    function.global_names.update(node.names)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{node.name}"
                stack.extend(d for d in [*node.decorator_list, *node.args.defaults,
                                         *node.args.kw_defaults] if d is not None)
                accessor = _accessor(node) if cls else None
                if accessor:  # a property's setter or deleter: not what reading it runs
                    self._index_body(module, node, f"{name}.<{accessor}>", cls, None)
                    continue
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

    def _resolved_bases(self, cls: str) -> list[str]:
        """What each base of ``cls`` names, as a dotted name: a package class or a library's
        (``torchmetrics.Metric``); bases the lint cannot resolve are left out."""
        klass, found = self.classes[cls], []
        for base in klass.bases:
            head = base.partition(".")[0]
            resolved = self.module_level(klass.module, head)
            if resolved:
                found.append(self.canonical(resolved + base[len(head):]))
        return found

    def bases(self, cls: str) -> list[str]:
        """The package classes ``cls`` derives from directly."""
        return [b for b in self._resolved_bases(cls) if b in self.classes]

    def library_bases(self, cls: str) -> set[str]:
        """The bases of ``cls`` and of its package bases that are not the package's, as
        dotted names (``torchmetrics.Metric``)."""
        found: set[str] = set()
        todo, seen = [cls], set()
        while todo:
            current = todo.pop()
            if current in seen or current not in self.classes:
                continue
            seen.add(current)
            for dotted in self._resolved_bases(current):
                (todo.append if dotted in self.classes else found.add)(dotted)
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

    def properties(self, classes: frozenset[str], name: str) -> list[str]:
        """The getters of a property ``name`` that an instance of ``classes`` may read: in the
        classes, their bases, or a subclass overriding it (a base's method reading
        ``self.name`` runs on the subclass's instances too), as ``attribute`` looks."""
        found = set()
        for cls in classes:
            for member in self.family(cls):
                getter = self.classes[member].methods.get(name) if member in self.classes else None
                if getter is not None and self.functions[getter].is_property:
                    found.add(getter)
        return sorted(found)

    def attribute(self, classes: frozenset[str], name: str) -> Facts:
        result = NOTHING
        for cls in classes:
            for member in self.family(cls):
                result = result | self.attributes.get((member, name), NOTHING)
        return result


def _own_calls(node: ast.AST):
    """The calls a function's own body makes: not those of the defs, classes and lambdas in
    it (functions of their own)."""
    stack = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call):
            yield current
        stack.extend(child for child in ast.iter_child_nodes(current) if not isinstance(
            child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda))
