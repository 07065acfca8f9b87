"""Generated programs: the lint flags a collective iff ranks can disagree on their sequence.

Hypothesis writes random functions from a small language (collectives, a package helper that
issues one, branches on rank-dependent and on uniform conditions, loops over range(rank) and
over a uniform count, return / break / continue, ``cond and collective``, two branches on one
rank value with a collective each and code between ("rank 0 goes first"), nested in each other;
a rank-dependent construct is not nested inside another, which the lint compares by shape
alone: docs/harness.md's limits of the lint), and a reference
interpreter runs each one's control flow for ranks 0, 1 and 2 under every value the uniform
conditions and counts can take, recording the collectives each rank issues. Then:

- the ranks' sequences are equal whatever the uniform values: the lint reports nothing (but
  code no rank runs, and what only the correlation of two uses of one uniform value makes
  safe: the lint neither solves conditions nor tracks that `c1` tested twice is the same);
- two ranks' sequences differ for some values: the lint reports, among others, a collective
  the two ranks run a different number of times under those values (where names repeat, which
  one the ranks first disagree at is a matter of alignment; the one run on fewer ranks is the
  bug);
- every collective the lint reports runs a different number of times on two ranks for some
  values (or never runs at all), where uniform values are as the lint models them: the same
  on every rank at each evaluation, not necessarily the same at the next (``Decorrelated``).

A turn's two collectives run a different number of times on two ranks though every rank issues
one, so the last property cannot tell a pair the lint should pass from one it should not:
``test_two_turns_pass_iff_they_complement_each_other_around_quiet_code`` checks the pairing.
"""

from __future__ import annotations

import itertools
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refddp.lint import lint_source

COLLECTIVES = ("all_reduce", "barrier", "broadcast")
RANK_CONDS = {"rank == 0": lambda r: r == 0, "rank != 0": lambda r: r != 0,
              "rank > 0": lambda r: r > 0, "is_main": lambda r: r == 0}  # fmt: skip
# "rank 0 goes first": two branches on one value, each with a collective, something between;
# the conditions complement each other or do not (turns.py)
TURN_CONDS = {"rank >= 1": lambda r: r >= 1, "rank < 1": lambda r: r < 1,
              "rank not in (-1, 0)": lambda r: r not in (-1, 0), "rank in [0]": lambda r: r == 0,
              "rank == 1": lambda r: r == 1, "rank != 1": lambda r: r != 1,
              "not is_main": lambda r: r != 0}  # fmt: skip
ALL_RANK_CONDS = {**RANK_CONDS, **TURN_CONDS}
TURN_FAMILIES = (("rank == 0", "rank != 0", "rank > 0", "rank >= 1", "rank < 1",
                  "rank not in (-1, 0)", "rank in [0]", "rank == 1", "rank != 1"),
                 ("is_main", "not is_main"))  # fmt: skip
UNIFORM_CONDS = ("c1", "c2")
PREAMBLE = """import torch.distributed as dist


def sync(t):
    dist.all_reduce(t)


def f(t):
    rank = dist.get_rank()
    is_main = rank == 0
    c1 = dist.get_world_size() > 1
    c2 = dist.get_world_size() > 2
    n1 = dist.get_world_size() - 1
"""


def statements(depth: int, in_loop: bool, under_rank: bool = False):
    """One statement. Rank-dependent constructs do not nest inside each other: the lint
    compares a nested one by its shape alone (see rules.py), which the reference interpreter
    would hold it to exactly."""
    conds = list(UNIFORM_CONDS) if under_rank else sorted(RANK_CONDS) + list(UNIFORM_CONDS)
    leaf = [st.tuples(st.just("coll"), st.sampled_from(COLLECTIVES)),
            st.tuples(st.just("helper")),
            st.tuples(st.just("and"), st.sampled_from(conds), st.sampled_from(COLLECTIVES)),
            st.just(("return",))]  # fmt: skip
    if in_loop:
        leaf += [st.just(("break",)), st.just(("continue",))]
    if depth == 0:
        return st.one_of(leaf)

    def block(cond, loop=False):
        nested = under_rank or cond in RANK_CONDS or cond == "rank"
        return st.lists(statements(depth - 1, in_loop or loop, nested), min_size=int(loop),
                        max_size=3)  # fmt: skip

    branches = st.sampled_from(conds).flatmap(
        lambda c: st.tuples(st.just("if"), st.just(c), block(c), block(c)))
    loops = st.sampled_from(["n1"] if under_rank else ["rank", "n1"]).flatmap(
        lambda n: st.tuples(st.just("for"), st.just(n), block(n, loop=True)))
    if under_rank:
        return st.one_of(*leaf, branches, loops)
    family = st.sampled_from(TURN_FAMILIES)
    turns = family.flatmap(lambda f: st.tuples(
        st.just("turn"), st.sampled_from(f), st.sampled_from(f), st.sampled_from(COLLECTIVES),
        st.sampled_from(COLLECTIVES), st.lists(statements(depth - 1, in_loop), max_size=2)))
    return st.one_of(*leaf, branches, loops, turns)


programs = st.lists(statements(2, False), min_size=1, max_size=5)


def render(program) -> tuple[str, list]:
    """The Python source, and the program with each collective given its line number."""
    lines = PREAMBLE.splitlines()

    def emit(stmts, indent):
        out = []
        if not stmts:
            lines.append(" " * indent + "pass")
        for s in stmts:
            kind = s[0]
            if kind == "coll":
                args = "t, 0" if s[1] == "broadcast" else "t"
                lines.append(" " * indent + f"dist.{s[1]}({args})")
                out.append(("coll", s[1], len(lines)))
            elif kind == "helper":
                lines.append(" " * indent + "sync(t)")
                out.append(("coll", "all_reduce", len(lines)))
            elif kind == "and":
                args = "t, 0" if s[2] == "broadcast" else "t"
                lines.append(" " * indent + f"{s[1]} and dist.{s[2]}({args})")
                out.append(("and", s[1], ("coll", s[2], len(lines)), len(lines)))
            elif kind in ("return", "break", "continue"):
                lines.append(" " * indent + kind)
                out.append((kind,))
            elif kind == "if":
                lines.append(" " * indent + f"if {s[1]}:")
                where = len(lines)
                body = emit(s[2], indent + 4)
                lines.append(" " * indent + "else:")
                orelse = emit(s[3], indent + 4)
                out.append(("if", s[1], body, orelse, where))
            elif kind == "for":
                lines.append(" " * indent + f"for _ in range({s[1]}):")
                where = len(lines)
                out.append(("for", s[1], emit(s[2], indent + 4), where))
            elif kind == "turn":  # if A: coll_a / what runs between / if B: coll_b
                _, first, second, name_a, name_b, between = s
                out.append(turn(first, name_a, indent))
                out += emit(between, indent)
                out.append(turn(second, name_b, indent))
        return out

    def turn(cond, name, indent):
        lines.append(" " * indent + f"if {cond}:")
        where = len(lines)
        lines.append(" " * (indent + 4) + f"dist.{name}({'t, 0' if name == 'broadcast' else 't'})")
        return ("if", cond, [("coll", name, len(lines))], [], where)

    numbered = emit(program, 4)
    return "\n".join(lines) + "\n", numbered


class Stop(Exception):
    def __init__(self, kind):
        self.kind = kind


def run(program, rank: int, uniform) -> list[tuple[str, int]]:
    """The collectives one rank issues, (name, line), in order; ``uniform(name, line)`` is
    the value of the uniform condition or count ``name`` written at ``line``."""
    trace: list[tuple[str, int]] = []

    def holds(cond, line):
        return ALL_RANK_CONDS[cond](rank) if cond in ALL_RANK_CONDS else uniform(cond, line)

    def block(stmts):
        for s in stmts:
            kind = s[0]
            if kind == "coll":
                trace.append((s[1], s[2]))
            elif kind == "and":
                if holds(s[1], s[3]):
                    trace.append((s[2][1], s[2][2]))
            elif kind in ("return", "break", "continue"):
                raise Stop(kind)
            elif kind == "if":
                block(s[2] if holds(s[1], s[4]) else s[3])
            elif kind == "for":
                for _ in range(rank if s[1] == "rank" else uniform("n1", s[3])):
                    try:
                        block(s[2])
                    except Stop as stop:
                        if stop.kind == "break":
                            break
                        if stop.kind == "continue":
                            continue
                        raise

    try:
        block(program)
    except Stop:
        pass
    return trace


VALUES = {"c1": [False, True], "c2": [False, True], "n1": [0, 1, 2]}


def uniform_choices():
    """Every value of c1, c2 and n1: one value of each, wherever it is used."""
    for c1, c2, n1 in itertools.product(*VALUES.values()):
        chosen = {"c1": c1, "c2": c2, "n1": n1}
        yield chosen, lambda name, line, chosen=chosen: chosen[name]


def uses(program):
    """(name, line) of every use of a uniform condition or count."""
    found = []
    for s in program:
        if s[0] == "and" and s[1] in VALUES:
            found.append((s[1], s[3]))
        elif s[0] == "if":
            found += [(s[1], s[4])] * (s[1] in VALUES) + uses(s[2]) + uses(s[3])
        elif s[0] == "for":
            found += [(s[1], s[3])] * (s[1] in VALUES) + uses(s[2])
    return found


class Decorrelated:
    """The lint's own model of uniform values: each evaluation of a uniform condition or
    count is the same on every rank, but may differ from the evaluation before (the lint does
    not track that `c1` tested twice, or in two iterations, gives the same answer). One random
    draw of such values: the k-th evaluation of a use gets the same value on every rank."""

    def __init__(self, seed: int):
        self.seed, self.counts = seed, {}

    def start(self, rank: int) -> None:
        self.counts = {}  # each rank counts its own evaluations

    def __call__(self, name, line):
        k = self.counts[(name, line)] = self.counts.get((name, line), -1) + 1
        return random.Random(f"{self.seed}/{name}/{line}/{k}").choice(VALUES[name])


def decorrelated_choices(program, draws: int = 48):
    for seed in range(draws):
        yield {"seed": seed}, Decorrelated(seed)


def executions(program, choices):
    """Lines two ranks run a different number of times, lines run at all, and the choices
    under which two ranks' sequences differ, with the lines that differ there."""
    differently, executed, disagreements = set(), set(), []
    for chosen, uniform in choices:
        traces = []
        for rank in (0, 1, 2):
            if isinstance(uniform, Decorrelated):
                uniform.start(rank)
            traces.append(run(program, rank, uniform))
        counts = [{line: [x for _, x in t].count(line) for _, line in t} for t in traces]
        executed |= {line for t in traces for _, line in t}
        for a, b in itertools.combinations(range(3), 2):
            differ = {line for line in counts[a].keys() | counts[b].keys()
                      if counts[a].get(line) != counts[b].get(line)}  # fmt: skip
            differently |= differ
            if [n for n, _ in traces[a]] != [n for n, _ in traces[b]]:
                disagreements.append((chosen, (a, b), differ))
    return differently, executed, disagreements


# The CPU suite draws the same programs each run (a verdict must not depend on the draw);
# REFDDP_LINT_PROGRAMS=N draws N afresh (this is how the counterexample in
# test_a_symmetric_branch_after_a_rank_dependent_return_is_flagged_on_both_sides was found).
PROGRAMS = int(os.environ.get("REFDDP_LINT_PROGRAMS", "0"))


@settings(max_examples=PROGRAMS or 400, deadline=None, derandomize=not PROGRAMS,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(programs)
def test_the_lint_flags_a_collective_iff_the_ranks_can_disagree(program):
    source, numbered = render(program)
    flagged = {f.line for f in lint_source(source, "generated.py") if not f.is_note}
    notes = [f for f in lint_source(source, "generated.py") if f.is_note]
    assert notes == [], source
    differently, executed, disagreements = executions(numbered, uniform_choices())
    for chosen, ranks, differ in disagreements:
        assert flagged & differ, f"missed: ranks {ranks} disagree (lines {sorted(differ)}) " \
            f"with {chosen}\n{source}\nflagged: {sorted(flagged)}"  # fmt: skip
    loose, loose_executed, _ = executions(numbered, decorrelated_choices(numbered))
    excused = (flagged - executed - loose_executed) | loose
    assert flagged - differently - excused == set(), \
        f"flagged lines every rank runs alike: {sorted(flagged - differently)}\n{source}"


def test_a_symmetric_branch_after_a_rank_dependent_return_is_flagged_on_both_sides():
    # Found by the property test: rank 0 alone gets past the loop, and reaches the else side;
    # the sides' collectives are alike, so they merged, and only the first side was reported.
    source = """import torch.distributed as dist


def sync(t):
    dist.all_reduce(t)


def f(t):
    rank = dist.get_rank()
    for _ in range(rank):
        return
    if rank != 0:
        dist.all_reduce(t)
    else:
        sync(t)
"""
    flagged = {f.line for f in lint_source(source, "generated.py") if not f.is_note}
    assert {13, 15} <= flagged, flagged


# What may run between the two turns of "rank 0 goes first": quiet (nothing communicates,
# nothing leaves) or not.
QUIET = ("data = download()", "if c1:\n        data = download()", "pass")
NOISY = ("dist.all_reduce(t)", "sync(t)", "if c1:\n        return", "if rank == 0:\n        dist.barrier()")
TURN_SOURCE = PREAMBLE.replace("def f(t):", """def download():
    return [0]


def f(t):""")


ISSUES = {"barrier": "barrier", "all_reduce": "all_reduce", "sync": "all_reduce"}
CALLS = {"barrier": "dist.barrier()", "all_reduce": "dist.all_reduce(t)", "sync": "sync(t)"}


def turn_sequences(first, second, between, rank, c1) -> list[str]:
    """The collectives one rank issues in a generated turn (the reference); ``first`` and
    ``second`` are (guard, condition, collective)."""
    def half(guard, cond, name):
        return [ISSUES[name]] if (not guard or c1) and ALL_RANK_CONDS[cond](rank) else []

    seq = half(*first)
    for b in between:
        if b in ("dist.all_reduce(t)", "sync(t)"):
            seq.append("all_reduce")
        elif b.startswith("if c1:\n        return") and c1:
            return seq
        elif b.startswith("if rank == 0") and rank == 0:
            seq.append("barrier")
    return seq + half(*second)


halves = st.tuples(st.sampled_from(("", "c1 and ")), st.sampled_from(tuple(ISSUES)))


@settings(max_examples=PROGRAMS or 300, deadline=None, derandomize=not PROGRAMS)
@given(st.sampled_from(TURN_FAMILIES).flatmap(lambda f: st.tuples(st.sampled_from(f),
                                                                  st.sampled_from(f))),
       halves, halves, st.lists(st.sampled_from(QUIET + NOISY), max_size=3))  # fmt: skip
def test_two_turns_pass_iff_they_complement_each_other_around_quiet_code(conds, a, b, between):
    """Paired (complementary conditions behind the same uniform guard, the same collectives,
    quiet code between): nothing reported. Ranks 0-3 issuing different sequences for some
    value of ``c1``: reported."""
    first, second = (a[0], conds[0], a[1]), (b[0], conds[1], b[1])
    lines = [*TURN_SOURCE.splitlines()]
    for part in (first, None, second):
        if part is None:
            lines += [f"    {x}" for x in between]
            continue
        guard, cond, name = part
        lines += [f"    if {guard}{cond}:", f"        {CALLS[name]}"]
    source = "\n".join(lines) + "\n"
    flagged = {f.line for f in lint_source(source, "generated.py") if not f.is_note}
    ranks = range(4)
    complement = all(ALL_RANK_CONDS[conds[0]](r) != ALL_RANK_CONDS[conds[1]](r) for r in ranks)
    if complement and a[0] == b[0] and ISSUES[a[1]] == ISSUES[b[1]] and all(
            x in QUIET for x in between):  # fmt: skip
        assert flagged == set(), source  # every rank issues one, nothing between: fine
    disagree = any(len({tuple(turn_sequences(first, second, between, r, c1)) for r in ranks})
                   > 1 for c1 in (False, True))  # fmt: skip
    if disagree:
        assert flagged, source
