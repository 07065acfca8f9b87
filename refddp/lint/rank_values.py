"""Which values are rank-dependent, and what else the lint follows through expressions.

A value is rank-dependent ("multi-valued", in PARCOACH's words) when it may differ between
the ranks of a job. Sources:

- ``torch.distributed.get_rank(...)``, ``get_node_local_rank()``, a process group's or device
  mesh's ``rank()`` / ``get_rank()`` / ``get_local_rank()`` / ``get_coordinate()``;
- ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``NODE_RANK``, ``SLURM_PROCID``... read from
  ``os.environ[...]``, ``os.environ.get`` or ``os.getenv``;
- attributes named like a rank or a main-process flag (``ctx.rank``, ``ctx.is_main``,
  ``args.local_rank``, Accelerate's ``accelerator.is_main_process`` / ``process_index``,
  Lightning's ``trainer.is_global_zero`` / ``global_rank``) and calls of helpers named like
  one (``is_main_process()``, ``is_rank_zero()``);
- parameters named like a rank (``def main(rank, world_size)``, as ``mp.spawn`` calls it).

From there it flows through names, arithmetic, comparisons, conditions, subscripts,
containers, conversions (``int``, ``bool``, ``len``, ``range``...), the package's own
functions' return values, attributes the package assigns (``self.rank = ...``), what its
properties return, and module globals. Not through library calls (``torch.tensor(rank)``,
``DataLoader(..., rank=rank)``: following those would make every batch and loss
rank-dependent) and not into text (f-strings,
``str()``, concatenation with a string: ``f"cuda:{local_rank}"`` is a label, not a branch).
The world size is not rank-dependent.

The same walk follows, for the collectives' sake, models wrapped in DDP or FSDP and what their
forward computes (a loss whose ``backward()`` all-reduces gradients), objects of the libraries
and package classes, and functions passed around as values.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

RANK_ENV = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NODEID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK", "PMIX_RANK",
})  # fmt: skip
RANK_FUNCTIONS = frozenset({"torch.distributed.get_rank", "torch.distributed.get_node_local_rank",
                            "torch.distributed.distributed_c10d.get_rank"})  # fmt: skip
RANK_METHODS = frozenset({"rank", "get_rank", "get_local_rank", "get_node_local_rank",
                          "get_coordinate", "local_rank", "global_rank"})  # fmt: skip
RANK_NAMES = frozenset({
    "rank", "local_rank", "global_rank", "node_rank", "group_rank", "ddp_rank",
    "ddp_local_rank", "rank_id", "process_index", "local_process_index", "is_main",
    "is_master", "is_main_process", "is_local_main_process", "master_process",
    "is_rank_zero", "is_global_zero", "is_local_zero",
})  # fmt: skip
# is_main_process(), is_master(), is_rank_zero(), is_local_main_process(), master_process...;
# Hugging Face Trainer's is_world_process_zero() and is_local_process_zero (not its
# should_save / should_log: TrainingArguments' are rank 0's, TrainerControl's every rank's)
HELPER = re.compile(r"^(is_(main|master|local_master|main_process|local_main(_process)?"
                    r"|rank_?(0|zero)|global_zero|local_zero|main_rank|(world|local)_process_zero)"
                    r"|(master|main)_process)$")
CONVERSIONS = frozenset({"int", "float", "bool", "abs", "len", "range", "min", "max", "round",
                         "sum", "list", "tuple", "set", "sorted", "reversed", "enumerate",
                         "zip", "any", "all", "divmod", "pow", "hash", "iter", "next"})
# conversions that keep their argument's length: over a list the same length on every rank
SIZE_KEEPING = frozenset({"enumerate", "zip", "reversed", "sorted", "list", "tuple", "iter"})
# arithmetic whose result is as rank-dependent as its arguments: math.ceil(len(shard) / batch)
ARITHMETIC = frozenset({"math.ceil", "math.floor", "math.trunc", "math.sqrt", "math.isqrt",
                        "math.log", "math.log2", "math.prod", "math.fsum", "math.gcd",
                        "math.lcm", "math.fabs", "numpy.ceil", "numpy.floor"})
# Progress bars that yield their first argument's items, as many (rank 0 alone shows one): a
# loop over ``tqdm(loader) if rank == 0 else loader`` runs as often on every rank.
PROGRESS_BARS = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.std.tqdm", "tqdm.notebook.tqdm",
                           "tqdm.rich.tqdm", "rich.progress.track"})


def progress_bar_over(node: ast.expr, dotted: Callable[[ast.expr], str | None]) -> ast.expr | None:
    """What ``node`` shows progress over, where it is a progress bar's call (``PROGRESS_BARS``);
    ``dotted`` resolves a callee's name."""
    if isinstance(node, ast.Call) and node.args and dotted(node.func) in PROGRESS_BARS:
        return node.args[0]
    return None


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a value became rank-dependent: the source expression, its file and line."""

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def since(origin: Origin) -> str:
    """How a finding says where its condition became rank-dependent."""
    return f"rank-dependent since {origin}, `{origin.text}`"


@dataclass(frozen=True, slots=True)
class Facts:
    """What the lint knows of a value."""

    rank: Origin | None = None  # rank-dependent, since there
    # the parameters of the function being analysed that the value derives from: it is
    # rank-dependent where a caller passes a rank-dependent value (checked at call sites)
    params: frozenset[str] = field(default_factory=frozenset)
    wrapped: str | None = None  # a model wrapped in "DDP" or "FSDP"
    output: str | None = None  # computed by such a model's forward ("DDP" / "FSDP")
    library: str | None = None  # the (top-level) library that made this object
    classes: frozenset[str] = field(default_factory=frozenset)  # package classes it may be
    functions: frozenset[str] = field(default_factory=frozenset)  # package functions it may be
    # a container whose contents may differ between ranks but whose length does not (a list
    # literal, a comprehension over a uniform range): a loop over it runs as often everywhere
    sized: bool = False

    @property
    def varies(self) -> bool:
        return self.rank is not None or bool(self.params)

    @property
    def same_length(self) -> bool:
        """As long on every rank (a length from a parameter counts: its callers are the
        loop's business, where it loops over the parameter itself)."""
        return self.sized or self.rank is None

    def __or__(self, other: Facts) -> Facts:
        if other is NOTHING or other is self:
            return self
        if self is NOTHING:
            return other
        return Facts(self.rank or other.rank, self.params | other.params,
                     self.wrapped or other.wrapped, self.output or other.output,
                     self.library or other.library, self.classes | other.classes,
                     self.functions | other.functions,
                     self.same_length and other.same_length)  # fmt: skip

    def ranked(self, origin: Origin | None) -> Facts:
        if origin is None or self.rank:
            return self
        return Facts(origin, self.params, self.wrapped, self.output, self.library,
                     self.classes, self.functions)  # fmt: skip

    def depends(self, other: Facts) -> Facts:
        """These facts, also rank-dependent wherever ``other`` is."""
        if other.rank is None and not other.params:
            return self
        return Facts(self.rank or other.rank, self.params | other.params, self.wrapped,
                     self.output, self.library, self.classes, self.functions)  # fmt: skip

    def dependence(self, sized: bool = False) -> Facts:
        """Only whether the value is rank-dependent (directly or through parameters)."""
        return Facts(rank=self.rank, params=self.params, sized=sized)


NOTHING = Facts()


def env_key(node: ast.expr) -> str | None:
    """The environment variable an ``os.environ[...]`` subscript or ``.get()`` reads."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class Resolver:
    """What the evaluator asks the package index (``calls.py``); defaults know nothing."""

    def dotted(self, expr: ast.expr) -> str | None:  # a module-level name, imports resolved
        return None

    def global_facts(self, name: str) -> Facts:  # a free name: module global or import
        return NOTHING

    def call_facts(self, call: ast.Call, callee: Facts, dotted: str | None,
                   args: list[Facts]) -> Facts:  # fmt: skip
        return NOTHING

    def attribute_facts(self, base: Facts, name: str) -> Facts:
        return NOTHING

    def lambda_facts(self, node: ast.Lambda) -> Facts:  # the lambda, as a function value
        return NOTHING


class Evaluator:
    """The facts of an expression in one function's environment."""

    def __init__(self, path: str, env: dict[str, Facts], resolver: Resolver):
        self.path, self.env, self.resolver = path, env, resolver
        self._memo: dict[int, Facts] = {}

    def origin(self, node: ast.AST) -> Origin:
        return Origin(self.path, node.lineno, ast.unparse(node)[:60])  # type: ignore[attr-defined]

    def name(self, name: str) -> Facts:
        if name in self.env:
            return self.env[name]
        return self.resolver.global_facts(name)

    def rank_of(self, node: ast.expr | None) -> Origin | None:
        return None if node is None else self.facts(node).rank

    def facts(self, node: ast.expr) -> Facts:
        found = self._memo.get(id(node))
        if found is None:
            found = self._memo[id(node)] = self._facts(node)
        return found

    def _facts(self, node: ast.expr) -> Facts:  # noqa: C901 (one case per expression kind)
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.BinOp):
            merged = self.facts(node.left) | self.facts(node.right)
            if _is_text(node.left) or _is_text(node.right):
                return replace(merged, rank=None, params=frozenset())
            return merged
        if isinstance(node, ast.BoolOp):
            return _union(self.facts(v) for v in node.values)
        if isinstance(node, ast.Compare):
            if self._is_set_test(node):
                return NOTHING  # `RANK` set or not: distributed or not, alike on every rank
            return _union(self.facts(v).dependence() for v in [node.left, *node.comparators])
        if isinstance(node, ast.UnaryOp):
            return self.facts(node.operand).dependence()
        if isinstance(node, ast.IfExp):
            for shown, plain in ((node.body, node.orelse), (node.orelse, node.body)):
                over = progress_bar_over(shown, self.resolver.dotted)
                if over is not None and ast.dump(over) == ast.dump(plain):
                    return self.facts(plain)  # the same items either way
            return (self.facts(node.body) | self.facts(node.orelse)).depends(
                self.facts(node.test))
        if isinstance(node, ast.Tuple | ast.List | ast.Set):  # as long on every rank, unless *x
            sized = not any(isinstance(e, ast.Starred) for e in node.elts)
            return replace(_union(self.facts(e) for e in node.elts), sized=sized)
        if isinstance(node, ast.Dict):
            return _union(self.facts(v) for v in node.values if v is not None)
        if isinstance(node, ast.Starred | ast.Await | ast.NamedExpr):
            return self.facts(node.value)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            element = node.value if isinstance(node, ast.DictComp) else node.elt
            shape = [self.facts(g.iter) for g in node.generators] + [
                self.facts(c) for g in node.generators for c in g.ifs]
            sized = all(f.same_length for f in shape[: len(node.generators)]) and not any(
                f.varies for f in shape[len(node.generators):])
            return _union([self.facts(element).dependence(), *(f.dependence() for f in shape)]
                          ).dependence(sized)  # fmt: skip
        if isinstance(node, ast.Slice):  # items[rank::world_size]: a rank's own shard
            return _union(self.facts(p).dependence() for p in (node.lower, node.upper, node.step)
                          if p is not None)  # fmt: skip
        if isinstance(node, ast.Lambda):
            return self.resolver.lambda_facts(node)
        return NOTHING  # constants, f-strings (text), slices

    def _is_set_test(self, node: ast.Compare) -> bool:
        """``int(os.environ.get("RANK", -1)) != -1``, ``os.environ.get("RANK") is None``: a
        launcher variable compared with a value no rank takes says whether it is set. So does
        a value named like a rank (``RANK != -1``, ``args.local_rank is not None``,
        ``local_rank >= 0``): -1 and None mean "not distributed", alike on every rank."""
        left = node.left
        while isinstance(left, ast.Call) and len(left.args) == 1 and \
                self.resolver.dotted(left.func) in ("builtins.int", "builtins.str"):  # fmt: skip
            left = left.args[0]
        origin = self.facts(left).rank
        # (a rank in a group, dist.get_rank(group), is -1 outside it: rank-dependent)
        in_a_group = origin is not None and re.search(r"rank\((?!\))", origin.text)
        if _named_like_a_rank(left) and not in_a_group and len(node.ops) == 1 and \
                _says_whether_set(node.ops[0], node.comparators[0]):  # fmt: skip
            return True
        if not (isinstance(left, ast.Call | ast.Subscript) and all(map(_no_rank_takes,
                                                                       node.comparators))):
            return False
        if isinstance(left, ast.Subscript):
            return _is_environ(left.value, self.resolver)
        dotted = self.resolver.dotted(left.func)
        return self._is_rank_source(left, dotted, None) and bool(
            dotted in ("os.environ.get", "os.getenv") or _is_environ(
                getattr(left.func, "value", left.func), self.resolver))


    def _attribute(self, node: ast.Attribute) -> Facts:
        base = self.facts(node.value)
        if node.attr in RANK_NAMES or HELPER.match(node.attr):
            return Facts(rank=self.origin(node))
        if base.wrapped and node.attr == "module":
            return Facts(library=base.library)  # DDP's .module: the user's own model
        found = self.resolver.attribute_facts(base, node.attr)
        if base.library and not found.library and not found.classes:
            found = found | Facts(library=base.library)
        return found.depends(base) | Facts(output=base.output)

    def _subscript(self, node: ast.Subscript) -> Facts:
        value = self.facts(node.value)
        if _is_environ(node.value, self.resolver) and env_key(node.slice) in RANK_ENV:
            return Facts(rank=self.origin(node))
        return Facts(output=value.output, library=value.library).depends(value).depends(
            self.facts(node.slice))

    def _call(self, node: ast.Call) -> Facts:
        func = node.func
        dotted = self.resolver.dotted(func)
        last = dotted.rpartition(".")[2] if dotted else getattr(func, "attr", None)
        if self._is_rank_source(node, dotted, last):
            return Facts(rank=self.origin(node))
        args = [self.facts(a) for a in node.args] + [self.facts(k.value) for k in node.keywords]
        if dotted in ARITHMETIC:
            return _union(a.dependence() for a in args).dependence()
        if dotted and dotted.startswith("builtins.") and last in CONVERSIONS:
            if last == "len" and all(a.same_length for a in args):
                return NOTHING  # the length of what is as long on every rank
            sized = last in SIZE_KEEPING and all(a.same_length for a in args)
            return _union(a.dependence() for a in args).dependence(sized)
        callee = self.facts(func) if not dotted else NOTHING
        output = next((a.output for a in args if a.output), None) or callee.output or (
            callee.wrapped if callee.wrapped else None)
        found = self.resolver.call_facts(node, callee, dotted, args)
        if isinstance(func, ast.Attribute) and not dotted:  # a method: of a rank-dependent value?
            found = found.depends(self.facts(func.value))
        return found | Facts(output=output)

    def _is_rank_source(self, node: ast.Call, dotted: str | None, last: str | None) -> bool:
        if dotted in RANK_FUNCTIONS:
            return True
        if dotted in ("os.environ.get", "os.getenv") and node.args:
            return env_key(node.args[0]) in RANK_ENV
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args and \
                _is_environ(node.func.value, self.resolver):  # fmt: skip
            return env_key(node.args[0]) in RANK_ENV
        if last is None:
            return False
        if isinstance(node.func, ast.Attribute) and not dotted and last in RANK_METHODS:
            return True
        return bool(HELPER.match(last)) or (last in ("get_rank", "get_local_rank") and
                                            dotted is not None)  # fmt: skip


def _union(facts) -> Facts:
    result = NOTHING
    for f in facts:
        result = result | f
    return result


def _named_like_a_rank(node: ast.expr) -> bool:
    """``rank``, ``RANK``, ``args.local_rank``, ``self.global_rank``: a rank itself, not a
    value computed from one (``rank - 1 == -1`` holds on rank 0 alone)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(node, ast.Name | ast.Attribute) and name.lower() in RANK_NAMES - {
        "is_main", "is_master", "is_main_process", "is_local_main_process", "master_process",
        "is_rank_zero", "is_global_zero", "is_local_zero"}  # fmt: skip


def _says_whether_set(op: ast.cmpop, value: ast.expr) -> bool:
    """Compared so, a rank (≥ 0 when set; -1 or None when not) gives the same answer on
    every rank: ``== -1``, ``!= -1``, ``is None``, ``is not None``, ``>= 0``, ``< 0``."""
    if _no_rank_takes(value):
        return isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot | ast.Gt | ast.GtE |
                          ast.Lt | ast.LtE)  # fmt: skip
    zero = isinstance(value, ast.Constant) and value.value == 0 and type(value.value) is int
    return zero and isinstance(op, ast.GtE | ast.Lt)


def _no_rank_takes(node: ast.expr) -> bool:
    """None or a negative number: compared with one, a rank only says whether it is set."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and \
            node.value > 0  # fmt: skip
    return isinstance(node, ast.Constant) and node.value is None


def _is_text(node: ast.expr) -> bool:
    """A string literal or f-string: concatenating or formatting into it makes text."""
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant)
                                               and isinstance(node.value, str))  # fmt: skip


def _is_environ(node: ast.expr, resolver: Resolver) -> bool:
    return resolver.dotted(node) == "os.environ"
