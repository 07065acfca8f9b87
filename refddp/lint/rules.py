"""The rules: where a collective's execution depends on the rank.

For every rank-dependent branch the lint compares what the two sides go on to issue, up to the
end of the function: the side's own collectives, then the code after the branch (for a side
that falls through), after the loop (``break``), the loop's next iterations (``continue``) or
nothing (``return``, ``raise``). Equal sequences pass (symmetric branches, a ``return`` after
the same collective the other side reaches later); otherwise, from the first difference on:

- ``RDL101``: each collective written inside a side (and the package calls that issue one);
- ``RDL102``: where no side has one, the first collective the code after the branch issues,
  which the ranks that left early skip;
- ``RDL103``: a collective in a loop over a rank-dependent value, or whose condition is one;
- ``RDL104``: a function passed to a helper that calls it under a rank-dependent condition
  (``rank0_then_meet(save)``) and issues a collective; the helper's own call is fine;
- ``RDL201``: a call under a rank-dependent condition that the lint cannot see into: a value
  it cannot resolve, or a library call that may or may not communicate (a DDP forward).

A branch on a parameter (``def f(flag): if flag: dist.barrier()``) is checked the same way,
but reported only where a caller passes a rank-dependent value for it (``f(rank == 0)``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from refddp.lint.callers import SINCE, CallerChecks, Pending
from refddp.lint.findings import Finding
from refddp.lint.ir import Branch, Call, Exit, Loop, Try
from refddp.lint.rank_values import Origin, since
from refddp.lint.sequences import ESCAPING, Atom, Sequences, first_collective, keys, sites


@dataclass(frozen=True)
class Context:
    """The innermost rank-dependent construct around a node: for notes and obligations."""

    text: str
    origin: Origin
    negated: bool = False  # in the branch taken where the condition is false
    turns: tuple[int, int] | None = None  # between two paired turns (turns.py): their lines

    @property
    def where(self) -> str:
        """Where the node runs, as a note says it: "`rank == 0`", "`rank == 0` is false"."""
        return f"`{self.text}`" + (" is false" if self.negated else "")

    def runs(self, subject: str = "it runs") -> str:
        """Where a call in this context runs, as a note says it: between two turns it runs
        on every rank, before the collectives on some and after them on the others."""
        if self.turns:
            first, second = self.turns
            return (f"{subject} between the two turns of a \"rank 0 goes first\", before the "
                    f"collectives of line {first} where `{self.text}` and after those of line "
                    f"{second} on the other ranks")
        return f"{subject} only where {self.where}"


class Rules(CallerChecks):
    """Walks every function's tree and reports."""

    def __init__(self, sequences: Sequences, paths: dict[str, str]):
        self.seq = sequences
        self.paths = paths  # qualname -> file as shown
        self.findings: dict[tuple, Finding] = {}
        # function -> its parameters it calls on some ranks only: where, and the call
        self.obligations: dict[str, dict[str, tuple[Context, Call]]] = {}
        self.passed: set[tuple[str, str]] = set()  # (function, parameter) some caller passes
        self.pending: dict[str, dict[Pending, str]] = {}
        self.params: frozenset[str] = frozenset()  # non-empty: findings wait for a caller
        self.membership = False  # the branch being compared tests membership

    def report(self, node: ast.AST, code: str, message: str, path: str | None = None) -> None:
        path = path or self.path
        line, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        if self.params:
            self.pending.setdefault(self.qualname, {}).setdefault(
                Pending(self.params, path, line, col, code), message)
            return
        # one finding per site (the innermost construct's, reported last) and per kind
        self.findings[(path, line, col, code[:4])] = Finding(path, line, col, code, message)

    def describe(self, call: Call) -> str:
        if call.kind == "package":
            issued = first_collective(tuple(a.key for a in self.seq.call_atoms(call)))
            return f"{call.text}, which issues {issued}," if issued else call.text
        if call.why:  # a collective its source text does not name: say why it is one
            return f"{call.text} ({call.why})"
        return call.text

    # -- the walk -----------------------------------------------------------------------

    def function(self, qualname: str, tree: list) -> None:
        self.qualname, self.path = qualname, self.paths[qualname]
        self.walk(tree, (), None)

    def check(self, node: Branch | Loop, check) -> None:
        """Run ``check`` now (a rank-dependent construct) or for the callers (a parameter's)."""
        if node.rank:
            check(since(node.rank))
        elif node.params:
            outer, self.params = self.params, node.params
            check(SINCE)
            self.params = outer

    def walk(self, nodes: list, frames: tuple, ctx: Context | None) -> None:
        for i, node in enumerate(nodes):
            here = (("block", nodes[i + 1 :]), *frames)
            if isinstance(node, Exit):
                return
            if isinstance(node, Call):
                self.call(node, ctx)
            elif isinstance(node, Branch):
                inner = Context(node.text, node.rank, turns=node.turns) if node.rank else ctx
                self.check(node, lambda why, n=node, h=here: self.branch(n, h, why))
                self.walk(node.a, here, inner)
                negated = Context(node.text, node.rank, negated=True) if node.rank else ctx
                self.walk(node.b, here, negated)
                if node.rank and not ctx and self._leaves(node):
                    # the rest runs on some ranks only: where the condition is false if its
                    # side alone leaves (``if rank != 0: return``)
                    ctx = Context(node.text, node.rank, negated=self._leaves_alone(node))
            elif isinstance(node, Loop):
                inner = Context(f"for ... in {node.text}", node.rank) if node.rank else ctx
                self.check(node, lambda why, n=node, h=here: self.loop(n, h, why))
                self.walk(node.body, (("loop", node), *here), inner)
                self.walk(node.orelse, here, ctx)
            elif isinstance(node, Try):
                self.walk(node.body + node.orelse + node.final, here, ctx)
                for handler in node.handlers:
                    self.walk(handler, here, ctx)

    def _leaves(self, node: Branch) -> bool:
        return bool(self.seq.atoms(node.a)[1] or self.seq.atoms(node.b)[1])

    def _leaves_alone(self, node: Branch) -> bool:
        """The branch's own side leaves (returns, raises...) and its ``else`` does not."""
        return bool(self.seq.atoms(node.a)[1]) and not self.seq.atoms(node.b)[1]

    def call(self, call: Call, ctx: Context | None) -> None:
        if ctx is None or call.kind == "collective":
            return
        if call.kind == "param":
            self.obligations.setdefault(self.qualname, {}).setdefault(call.name, (ctx, call))
            return
        why = call.why
        if call.kind == "package" and not call.guess:
            if any(self.seq.issues(t) for t in call.targets):
                return  # a collective: the branch's comparison reports it
            inner = next(filter(None, map(self.seq.maybe, call.targets)), None)
            if inner is None:
                return
            where = self.paths.get(self._owner(inner), "")
            why = f"it calls {inner.text} ({where}:{inner.node.lineno}): {inner.why}"
        elif call.kind == "package":
            if not any(self.seq.issues(t) for t in call.targets):
                return
            why = (f"it is a method of an object the lint cannot tell the class of, and some "
                   f"methods named {call.name.rpartition('.')[2]}() issue collectives")
        self.report(call.node, "RDL201",
                    f"cannot tell whether {call.text} issues a collective: {why}; {ctx.runs()} "
                    f"({since(ctx.origin)}): the harness's run-time check covers it")  # fmt: skip

    def _owner(self, call: Call) -> str:
        return call.scope.function.qualname

    # -- branches and loops -------------------------------------------------------------

    def future(self, nodes: list, frames: tuple) -> tuple[list[tuple[Atom, bool]], str | None]:
        """What ranks that run ``nodes`` issue up to the function's end; each atom with
        whether it is written in ``nodes`` themselves."""
        atoms, end = self.seq.atoms(nodes)
        atoms = _without_final_exit(atoms)
        out = [(a, True) for a in atoms] + [(a, False) for a in self.after(frames, end or "")]
        while out and not out[-1][0].collective:
            out.pop()  # nothing that communicates follows: where it stops does not matter
        return out, end

    def after(self, frames: tuple, kind: str) -> list[Atom]:
        """What runs after leaving a node list by ``kind`` ("" for falling through)."""
        out: list[Atom] = []
        for tag, item in frames:
            if kind in ESCAPING:
                break
            if tag == "block":
                if kind:
                    continue  # a break or continue skips the rest of the loop's body
                atoms, end = self.seq.atoms(item)
                out += _without_final_exit(atoms)
                kind = end or ""
                continue
            if kind != "break":
                body, _ = self.seq.atoms(item.body)  # the loop's next iterations
                if any(a.collective or a.escapes for a in body):
                    tag_key = ("rloop",) if item.rank else ("loop", item.text)
                    out.append(Atom.of((*tag_key, keys(body)), sites(body)))
            kind = ""
        return out

    def branch(self, node: Branch, frames: tuple, why: str) -> None:
        self.membership = node.membership
        self.compare(node.a, frames, node.b, frames, f"`{node.text}`", why, [*node.a, *node.b])
        self.membership = False

    def blame(self, site: Call, code: str, message: str) -> None:
        """Report ``site``; a subgroup's collective under a membership test is a note: the
        members alone must call it, and the lint does not know who they are."""
        if site.group and self.membership:
            self.report(site.node, "RDL201",
                        f"cannot tell whether every member of the group {site.group} reaches "
                        f"it (only they may, and the condition tests membership): {message}; "
                        "the harness's run-time check covers it")  # fmt: skip
        else:
            self.report(site.node, code, message)

    def compare(self, a: list, frames_a: tuple, b: list, frames_b: tuple, cond: str, why: str,
                inside: list) -> None:  # fmt: skip
        """Report where ranks running ``a`` and ranks running ``b`` part ways."""
        (fa, end_a), (fb, end_b) = self.future(a, frames_a), self.future(b, frames_b)
        if [x.key for x, _ in fa] == [y.key for y, _ in fb]:
            return
        # the same code both sides reach at the end runs alike on both (unless a side may
        # return or raise before it): it is not where they part
        e = 0
        while e < min(len(fa), len(fb)) and _same(fa[-1 - e][0], fb[-1 - e][0]):
            e += 1
        leaving = bool({end_a, end_b} & ESCAPING) or any(
            x.escapes for f in (fa, fb) for x, _ in f[: len(f) - e])  # before the shared end
        if not leaving:
            fa, fb = fa[: len(fa) - e], fb[: len(fb) - e]
        # the first place where the sides differ: in what they issue, or in whether it is
        # written in the side itself (one side's own barrier meeting the other side's barrier
        # after the branch is a coincidence of names, not a match)
        d = next((i for i, ((x, own_x), (y, own_y)) in enumerate(zip(fa, fb, strict=False))
                  if x.key != y.key or own_x != own_y), min(len(fa), len(fb)))  # fmt: skip
        own = [(s, side) for side, f in (("a", fa), ("b", fb)) for x, mine in f[d:] if mine
               for s in sites([x])]  # fmt: skip
        for site, side in own:
            other = fb if side == "a" else fa
            instead = first_collective(tuple(x.key for x, _ in other[d:]))
            where = f"under {cond}" if side == "a" else f"where {cond} is false"
            what = (f"the other ranks reach {instead} instead" if instead
                    else "the other ranks issue no collective to match it")
            self.blame(site, "RDL101", f"{self.describe(site)} {where} ({why}): {what}")
        definite = any(x.key[0] == "c" for f in (fa, fb) for x, mine in f[d:] if mine)
        if (definite or own) and not leaving:
            return  # the sides' own collectives are where the ranks part
        # the ranks that leave (or whose own collectives may not run) skip what follows
        fallers = [f for f, end in ((fa, end_a), (fb, end_b)) if end is None] or [fa, fb]
        exit_node = _first_exit(inside)
        left = (f"{exit_node.kind} at line {exit_node.node.lineno}" if exit_node
                else "leave early")  # fmt: skip
        for future in fallers:  # up to the first collective that surely runs
            for x, mine in future[d:]:
                if mine or not x.collective:
                    continue
                # (a collective atom has more than one site where symmetric sides of a branch
                # merged into it: each rank that stays runs one of them, so each is skipped)
                for site in sites([x]):
                    self.blame(site, "RDL102",
                                f"{self.describe(site)} is skipped by the ranks that {left} "
                                f"under {cond} ({why})")  # fmt: skip
                if x.key[0] == "c":
                    break

    def loop(self, node: Loop, frames: tuple, why: str) -> None:
        body, _ = self.seq.atoms(node.body)
        kind = "while" if isinstance(node.node, ast.While) else "for ... in"
        for site in sites(body):
            self.report(site.node, "RDL103",
                        f"{self.describe(site)} in a loop whose trip count is rank-dependent: "
                        f"`{kind} {node.text}` ({why})")
        if any(isinstance(n, Exit) for n in _all_nodes(node.body)):
            # a return or break inside: ranks that enter the loop and ranks that skip it
            self.compare(node.body, (("loop", node), *frames), [], frames,
                         f"`{kind} {node.text}`", why, node.body)


def _without_final_exit(atoms: list[Atom]) -> list[Atom]:
    """A node list's atoms without the exit it ends in (its future goes on from there)."""
    return atoms[:-1] if atoms and atoms[-1].key[0] == "x" else atoms


def _same(x: Atom, y: Atom) -> bool:
    """The same code: equal atoms written at the same places."""
    return x.key == y.key and [id(s) for s in x.sites] == [id(s) for s in y.sites]


def _all_nodes(nodes: list):
    for node in nodes:
        yield node
        if isinstance(node, Branch):
            yield from _all_nodes(node.a + node.b)
        elif isinstance(node, Loop):
            yield from _all_nodes(node.body + node.orelse)
        elif isinstance(node, Try):
            yield from _all_nodes(node.body + node.orelse + node.final +
                                  [n for h in node.handlers for n in h])  # fmt: skip


def _first_exit(nodes: list) -> Exit | None:
    return next((n for n in _all_nodes(nodes) if isinstance(n, Exit)), None)
