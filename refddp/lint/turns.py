""""Rank 0 goes first": two branches that issue the same collectives on complementary ranks.

::

    if rank != 0:
        dist.barrier()   # the other ranks wait here...
    prepare_data()       # ...while rank 0 downloads or builds a cache,
    if rank == 0:
        dist.barrier()   # then rank 0 meets them here

Every rank issues one barrier, at two places in the code. The rules compare a branch's two
sides without solving conditions, so they would see two barriers that each only some ranks
reach. YOLOv5's ``torch_distributed_zero_first``, Accelerate's ``main_process_first`` and many
training scripts are written this way.

This pass runs before the rules. It pairs two ``if``s of one block (a ``try`` without
``except`` counts as one block with its ``finally``) when:

- they test one expression with complementary conditions, rank numbers being taken as ≥ 0
  (``local_rank not in [-1, 0]`` against ``local_rank == 0``, ``rank > 0`` against ``rank ==
  0``, ``not is_main`` against ``is_main``); a comparison with a number only on a value named
  like a rank, since one computed from it (``rank - 1``) may be negative;
- they sit behind the same guard that is not rank-dependent (``initialized and ...``, an ``if
  world_size > 1:`` around each);
- each issues the same collectives (directly, or through the project's helpers that use the
  world's group only) and nothing else that matters, with no ``else`` that calls anything;
- the code between them issues no collective, cannot leave the block and assigns none of the
  names the conditions read.

The first turn's collectives then take its place, under its guard only, and the second turn
is dropped: that is what each rank issues. What ran between runs on every rank, before the
collectives on some and after them on the others, so a call there the lint cannot see into (a
callback) stays under the first condition: a note, and RDL104 at a caller that passes a
function that communicates.

In a context manager the body of the caller's ``with`` runs between the two branches, at the
``yield``. The lint does not see that, so it does not check the ``with`` body's collectives
against the pair.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from refddp.lint.ir import Branch, Call, Exit, Loop, Try, shown
from refddp.lint.rank_values import HELPER, RANK_METHODS, RANK_NAMES
from refddp.lint.sequences import Sequences, every_call

LARGEST_RANK = 1 << 20  # a comparison against a larger number is not read as a rank test


@dataclass(frozen=True)
class Test:
    """A condition on one expression: it holds exactly where the expression's value is in
    ``values`` (``inside``), or exactly where it is not."""

    subject: str  # the expression tested, as ``ast.dump`` writes it
    values: frozenset
    inside: bool

    def negated(self) -> Test:
        return Test(self.subject, self.values, not self.inside)

    def complements(self, other: Test) -> bool:
        return (self.subject, self.values) == (other.subject, other.values) and (
            self.inside != other.inside)


def rank_test(node: ast.expr) -> Test | None:
    """What ``node`` tests, where it is a comparison of one expression with integers or a
    truth value (``rank == 0``, ``local_rank not in (-1, 0)``, ``not is_main``); else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = rank_test(node.operand)
        return inner.negated() if inner else None
    if isinstance(node, ast.Compare):
        if len(node.ops) != 1:
            return None
        return _comparison(node.left, node.ops[0], node.comparators[0])
    if isinstance(node, ast.Name | ast.Attribute | ast.Call):  # true where it is not 0 (False
        return Test(ast.dump(node), frozenset({0}), False)  # == 0): ``rank``, ``is_main``
    return None


_FLIPPED = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
            ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}  # fmt: skip


def _comparison(left: ast.expr, op: ast.cmpop, right: ast.expr) -> Test | None:
    if _integer(left) is not None and _integer(right) is None and type(op) in _FLIPPED:
        left, right, op = right, left, _FLIPPED[type(op)]()  # 0 == rank: rank == 0
    subject = ast.dump(left)
    if isinstance(op, ast.In | ast.NotIn):
        if not isinstance(right, ast.List | ast.Tuple | ast.Set):
            return None
        numbers = [_integer(e) for e in right.elts]
        if any(n is None for n in numbers):
            return None
        values = frozenset(n for n in numbers if n is not None and n >= 0)
        return Test(subject, values, isinstance(op, ast.In))
    k = _integer(right)
    if k is None or not -1 <= k <= LARGEST_RANK:
        return None
    upto = lambda n: frozenset(range(max(n, 0)))  # noqa: E731 (ranks 0..n-1)
    if isinstance(op, ast.Eq | ast.NotEq):
        return Test(subject, frozenset({k} if k >= 0 else ()), isinstance(op, ast.Eq))
    if isinstance(op, ast.Lt):
        return Test(subject, upto(k), True)
    if isinstance(op, ast.LtE):
        return Test(subject, upto(k + 1), True)
    if isinstance(op, ast.Gt):
        return Test(subject, upto(k + 1), False)
    if isinstance(op, ast.GtE):
        return Test(subject, upto(k), False)
    return None


def _integer(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _integer(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


class Turns:
    """Rewrites each function's tree, pairing the turns; ``seq`` (of the trees as built)
    tells what a call of the package's own functions issues."""

    def __init__(self, seq: Sequences):
        self.seq = seq
        self.function: ast.AST | None = None  # the function being rewritten
        self._stores: list[tuple[str, int]] | None = None  # what it assigns, once asked

    def trees(self, trees: dict[str, list], nodes: dict[str, ast.AST]) -> dict[str, list]:
        """Each function's tree rewritten; ``nodes``: each function's ``ast`` node."""
        out = {}
        for qualname, tree in trees.items():
            self.function, self._stores = nodes[qualname], None
            out[qualname] = self.block(tree)
        return out

    def block(self, nodes: list) -> list:
        # a ``try`` without ``except`` runs its parts in a row, as the rules read it: its
        # ``finally`` may hold the second turn (Hugging Face's main_process_first)
        flat = [x for n in nodes for x in (n.body + n.orelse + n.final
                                           if isinstance(n, Try) and not n.handlers else [n])]
        nodes = [self.inside(n) for n in flat]
        out: list = []
        i = 0
        while i < len(nodes):
            j = self.partner(nodes, i)
            if j is None:
                out.append(nodes[i])
                i += 1
                continue
            # the first turn's collectives, on every rank; what ran between; not the second
            out += self.unturned(nodes[i]) + self.between(nodes[i], nodes[i + 1 : j], nodes[j])
            i = j + 1
        return out

    def inside(self, node):
        """``node`` with the blocks inside it rewritten."""
        if isinstance(node, Branch):
            return replace(node, a=self.block(node.a), b=self.block(node.b))
        if isinstance(node, Loop):
            return replace(node, body=self.block(node.body), orelse=self.block(node.orelse))
        if isinstance(node, Try):
            return Try(self.block(node.body), [self.block(h) for h in node.handlers],
                       self.block(node.orelse), self.block(node.final))  # fmt: skip
        return node

    def partner(self, nodes: list, i: int) -> int | None:
        """The index of the turn that completes the one at ``i``, if it is one."""
        first = self.turn(nodes[i])
        if first is None:
            return None
        guard, test, issued = first
        for j in range(i + 1, len(nodes)):
            second = self.turn(nodes[j])
            if second is not None and second[0] == guard and second[1].complements(test) and (
                    second[2] == issued) and not self.rebinds(nodes[i], nodes[j]):  # fmt: skip
                return j
            if not self.quiet(nodes[j]):
                return None
        return None

    def turn(self, node) -> tuple[tuple[str, ...], Test, tuple] | None:
        """What makes ``node`` a turn: an ``if`` on the rank (or a parameter) whose body issues
        collectives and does nothing else that matters, whose ``else`` (if any) calls nothing;
        the conditions every rank evaluates alike around it (its guard), its test on the rank
        and what it issues. ``if world > 1:`` around a turn, or ``initialized and ...`` in its
        condition, is its guard."""
        if not (isinstance(node, Branch) and isinstance(node.node, ast.If)):
            return None
        test = node.node.test
        if not node.rank and not node.params:  # a uniform ``if`` around a turn
            inner = self.turn(node.a[0]) if len(node.a) == 1 and not node.b else None
            return ((ast.dump(test), *inner[0]), *inner[1:]) if inner else None
        if not (node.a and self.communicates_only(node.a) and not any(every_call(node.b))):
            return None  # (an ``else`` with a call in it would be lost by the rewrite)
        terms = test.values if node.uniform_terms else [test]
        varying = [t for t in terms if ast.dump(t) not in node.uniform_terms]
        found = rank_test(varying[0]) if len(varying) == 1 and _of_a_rank(varying[0]) else None
        atoms, _ = self.seq.atoms(node.a)
        issued = tuple((a.key, tuple(s.group for s in a.sites)) for a in atoms)
        if found is None or not any(a.collective for a in atoms):
            return None
        return tuple(sorted(node.uniform_terms)), found, issued

    def unturned(self, node) -> list:
        """What a paired first turn issues on every rank: its body, under its guard."""
        if not node.rank and not node.params:
            return [replace(node, a=self.unturned(node.a[0]))]
        if not node.uniform_terms:
            return node.a
        guard = [t for t in node.node.test.values if ast.dump(t) in node.uniform_terms]
        text = " and ".join(shown(t) for t in guard)  # (a parameter in it: checked at calls)
        return [Branch(node.node, text, None, node.a, [], node.guard_params)]

    def between(self, first, nodes: list, second) -> list:
        """What ran between two paired turns. Some ranks run it before the collectives, the
        others after them, so a call the lint cannot see into there (a callback, a parameter)
        stays under the first turn's condition: a note, or a check at the callers (RDL104)."""
        if not any(c.kind != "package" for c in every_call(nodes)):
            return nodes
        while not first.rank and not first.params:
            first = first.a[0]  # the turn inside a uniform ``if``
        lines = (first.node.lineno, second.node.lineno)
        return [Branch(first.node, first.text, first.rank, nodes, [], first.params,
                       turns=lines)]

    def quiet(self, node) -> bool:
        """``node`` issues no collective and cannot leave: what may run between two turns (a
        call the lint cannot see into too: ``between`` keeps it under a condition)."""
        if isinstance(node, Exit):
            return False
        if isinstance(node, Call):
            if node.kind in ("collective", "maybe"):
                return False
            return node.kind != "package" or node.guess or not any(
                self.seq.issues(t) for t in node.targets)  # fmt: skip
        if isinstance(node, Branch):
            return all(map(self.quiet, node.a + node.b))
        if isinstance(node, Loop):
            return all(map(self.quiet, node.body + node.orelse))
        if isinstance(node, Try):
            return all(map(self.quiet, node.body + node.orelse + node.final +
                           [n for h in node.handlers for n in h]))  # fmt: skip
        return True

    def communicates_only(self, nodes: list) -> bool:
        """Collectives and calls of the package's own functions, under uniform conditions at
        most (``dist.barrier(device_ids=[r]) if use_ids else dist.barrier()``), none on a
        subgroup inside a helper (whose group the atoms do not tell): a turn's body."""
        for node in nodes:
            if isinstance(node, Call):
                if node.kind != "collective" and (node.kind != "package" or node.guess or any(
                        self.subgroups(t, set()) for t in node.targets)):  # fmt: skip
                    return False
            elif isinstance(node, Branch):
                if node.rank or node.params or not self.communicates_only(node.a + node.b):
                    return False
            else:
                return False
        return True

    def subgroups(self, qualname: str, seen: set) -> bool:
        """The package function issues a collective on a subgroup, itself or in a callee."""
        if qualname in seen or qualname not in self.seq.trees:
            return False
        seen.add(qualname)
        return any(c.group or (c.kind == "package" and any(self.subgroups(t, seen)
                                                           for t in c.targets))
                   for c in every_call(self.seq.trees[qualname]))  # fmt: skip

    def rebinds(self, first, second) -> bool:
        """A name the turns' conditions read is assigned between them (``rank = ...``)."""
        read = {n.id for t in (first, second) for n in ast.walk(t.node.test)
                if isinstance(n, ast.Name)} | {n.attr for t in (first, second)
                                               for n in ast.walk(t.node.test)
                                               if isinstance(n, ast.Attribute)}  # fmt: skip
        if self._stores is None:  # (read only where two turns would pair: rare)
            self._stores = _stores(self.function)
        start, end = first.node.end_lineno, second.node.lineno
        return any(start < line < end and name in read for name, line in self._stores)


def _stores(function: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of every name and attribute ``function`` assigns or deletes."""
    return [(n.id, n.lineno) if isinstance(n, ast.Name) else (n.attr, n.lineno)
            for n in ast.walk(function) if isinstance(n, ast.Name | ast.Attribute)
            and isinstance(n.ctx, ast.Store | ast.Del)]  # fmt: skip


def _of_a_rank(node: ast.expr) -> bool:
    """A test the rank-number reading (ranks are >= 0) holds for: on a value named like a
    rank (``rank``, ``args.local_rank``, ``dist.get_rank()``); a value computed from one
    (``rank - 1``) may be negative. A truth test (``is_main``, ``not rank``) holds for any."""
    if not isinstance(node, ast.Compare):
        return True
    left = node.left if not isinstance(node.left, ast.Constant) else node.comparators[0]
    if isinstance(left, ast.Call):
        left = left.func
    name = left.id if isinstance(left, ast.Name) else getattr(left, "attr", "")
    return name.lower() in RANK_NAMES or name in RANK_METHODS or bool(HELPER.match(name))
