"""The collectives a piece of code issues, as a sequence two branches can be compared by.

Each rank runs a sequence of collectives; a program is safe when every rank's sequence is the
same. The lint cannot run the code, so it compares shapes: an ``Atom`` is a collective
(``("c", "barrier")``), an exit (``("x", "return")``), a branch on a condition every rank
evaluates alike (``("if", "world_size > 1", <atoms>, <atoms>)``), a loop (``("loop", "range(n)",
<atoms>)``), or, nested, a rank-dependent branch or loop. Two sequences with equal atoms issue
equal collectives on every rank whatever the uniform conditions turn out to be; sites (where
each collective is written) ride along for the report but are not compared.

A call of the package's own function is its body's sequence spliced in (a ``return`` in it
ends the callee, not the caller). Branches whose two sides are equal collapse to one side:
``if rank == 0: save_a() else: save_b()`` is symmetric when both issue one barrier.
"""

from __future__ import annotations

from dataclasses import dataclass

from refddp.lint.ir import Branch, Call, Exit, Loop, Try

ESCAPING = {"return", "raise", "exit"}  # exits that leave the function, not just a loop


@dataclass(frozen=True)
class Atom:
    key: tuple
    sites: tuple = ()  # the Call nodes of this function that issue the collectives inside
    collective: bool = False
    escapes: bool = False  # holds a return / raise / exit

    @staticmethod
    def of(key: tuple, sites: tuple = ()) -> Atom:
        return Atom(key, sites, _has(key, "c"), _escapes(key))


def _has(key: tuple, tag: str) -> bool:
    if key and key[0] == tag:
        return True
    return any(isinstance(part, tuple) and any(isinstance(k, tuple) and _has(k, tag)
                                               for k in part) for part in key)  # fmt: skip


def _escapes(key: tuple) -> bool:
    if key and key[0] == "x":
        return key[1] in ESCAPING
    return any(isinstance(part, tuple) and any(isinstance(k, tuple) and _escapes(k)
                                               for k in part) for part in key)  # fmt: skip


def keys(atoms: list[Atom]) -> tuple:
    return tuple(a.key for a in atoms)


def sites(atoms: list[Atom]) -> tuple:
    """The calls inside ``atoms`` that issue collectives."""
    return tuple(s for a in atoms if a.collective for s in a.sites)


def first_collective(key_seq: tuple) -> str | None:
    """The name of the first collective in a sequence of keys."""
    for key in key_seq:
        if key[0] == "c":
            return key[1]
        for part in key[1:]:
            if isinstance(part, tuple) and part and isinstance(part[0], tuple):
                found = first_collective(part)
                if found:
                    return found
    return None


class Sequences:
    """Atoms of any node list, and each package function's summary, memoised."""

    def __init__(self, trees: dict[str, list]):
        self.trees = trees
        self._summaries: dict[str, tuple] = {}
        self._busy: set[str] = set()

    def atoms(self, nodes: list) -> tuple[list[Atom], str | None]:
        """The atoms of ``nodes``, and the exit they always end in (None: they fall through)."""
        out: list[Atom] = []
        for node in nodes:
            if isinstance(node, Exit):
                out.append(Atom.of(("x", node.kind)))
                return out, node.kind
            if isinstance(node, Call):
                out += self.call_atoms(node)
            elif isinstance(node, Branch):
                a, end_a = self.atoms(node.a)
                b, end_b = self.atoms(node.b)
                out += self.branch_atoms(node, a, b)
                if end_a and end_b:
                    return out, end_a
            elif isinstance(node, Loop):
                body, _ = self.atoms(node.body)
                if any(a.collective or a.escapes for a in body):
                    tag = ("rloop",) if node.rank else ("loop", node.text)
                    out.append(Atom.of((*tag, keys(body)), sites(body)))
                out += self.atoms(node.orelse)[0]
            elif isinstance(node, Try):
                for part in (node.body, node.orelse, node.final):
                    more, end = self.atoms(part)
                    out += more
                    if end:
                        return out, end
        return out, None

    def branch_atoms(self, node: Branch, a: list[Atom], b: list[Atom]) -> list[Atom]:
        if keys(a) == keys(b):
            return [Atom(x.key, x.sites + y.sites, x.collective, x.escapes)
                    for x, y in zip(a, b, strict=True)]  # fmt: skip
        if not a and not b:
            return []
        tag = ("rif",) if node.rank else ("if", node.text)
        return [Atom.of((*tag, keys(a), keys(b)), sites(a) + sites(b))]

    def call_atoms(self, call: Call) -> list[Atom]:
        if call.kind == "collective":
            return [Atom.of(("c", call.name), (call,))]
        if call.kind != "package" or call.guess:
            return []  # a method found by its name alone: never a guess (a note, rules.py)
        summaries = {self.summary(t) for t in call.targets}
        if len(summaries) == 1:
            (summary,) = summaries
            return [Atom.of(key, (call,)) for key in summary]
        if all(not s for s in summaries):
            return []
        return [Atom.of(("alt", *sorted(summaries)), (call,))]

    def summary(self, qualname: str) -> tuple:
        """The keys of a package function's body, as its callers see it: only what
        communicates. Its exits are its own business: a return ends the callee, and a raise
        on one rank is a failure the harness reports, not a branch of the caller."""
        if qualname in self._summaries:
            return self._summaries[qualname]
        if qualname in self._busy or qualname not in self.trees:
            return ()  # recursion: the call already being summarised adds nothing more
        self._busy.add(qualname)
        atoms, _ = self.atoms(self.trees[qualname])
        self._busy.discard(qualname)
        result = _communicating(keys(atoms))
        self._summaries[qualname] = result
        return result

    def issues(self, qualname: str) -> str | None:
        """The first collective a package function may issue, or None."""
        return first_collective(self.summary(qualname))

    def maybe(self, qualname: str, seen: set | None = None) -> Call | None:
        """A call in the function, or in what it calls, that may or may not communicate
        (a DDP forward, an FSDP state dict): what makes a call of it a note."""
        seen = set() if seen is None else seen
        if qualname in seen or qualname not in self.trees:
            return None
        seen.add(qualname)
        for call in every_call(self.trees[qualname]):
            if call.kind == "maybe":
                return call
            if call.kind == "package" and not call.guess:
                for target in call.targets:
                    found = self.maybe(target, seen)
                    if found is not None:
                        return found
        return None


def every_call(nodes: list):
    """The calls in ``nodes``, at any depth."""
    for node in nodes:
        if isinstance(node, Call):
            yield node
        elif isinstance(node, Branch):
            yield from every_call(node.a + node.b)
        elif isinstance(node, Loop):
            yield from every_call(node.body + node.orelse)
        elif isinstance(node, Try):
            yield from every_call(node.body + node.orelse + node.final +
                              [n for h in node.handlers for n in h])  # fmt: skip


def _communicating(key_seq: tuple) -> tuple:
    """The keys without exits, and without the branches and loops left with no collective."""
    kept = []
    for key in key_seq:
        if key[0] == "x" or not _has(key, "c"):
            continue
        kept.append(tuple(_communicating(p) if isinstance(p, tuple) and p and
                          isinstance(p[0], tuple) else p for p in key))  # fmt: skip
    return tuple(kept)
