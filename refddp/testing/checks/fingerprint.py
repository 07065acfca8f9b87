"""The fingerprint check: before a collective reaches torch, every rank of its group compares
what it is about to run (``signatures.py``) with the others, and all raise ``CollectiveMismatch``
naming each rank's call if they differ, instead of hanging or completing with wrong data.

Where it is exchanged, so that it never changes the user's groups' sequences of collectives
(the check is blocking, also before an ``async_op=True`` call: a program that overlaps an async
collective with a point-to-point exchange the other ranks make first can hang under the check
where torch completes it; docs/known-limitations.md):

- **A group of every rank** (the default group, however it is named; a ``new_group`` of every
  rank; a backend object built directly with the world's size): a hash of each rank's
  fingerprint, compared on the pool's board (``board.py``: a file every rank maps, cheaper than
  an all-reduce at many ranks), and an all-gather of every rank's text on the pool's helper
  group only on a mismatch. all_to_all's split sizes must pair up across ranks,
  which a hash cannot compare: one more all-reduce, of a world x world matrix of what each rank
  sends and expects, up to ``PAIRING_LIMIT`` ranks (above it, pairing is not checked).
- **A subgroup** (``new_group`` of some ranks): through the pool's store. Each member posts its
  record under (group, k-th checked collective of that group, its group rank); the group's rank
  0 compares them and posts the verdict every member reads. A member that never comes is seen in
  the waiting ranks' own slot files: one blocked for ``CONFLICT_CONFIRM_S`` in another
  collective that needs this rank (a different group, of other ranks or of the same ranks, told
  apart by the number torch gave it; a receive from it) can never come, and the waiting rank
  raises, naming both. Not a member still inside a collective this rank has entered too (its
  position on its group, in its slot, tells: ``enter``): it is finishing it.
- **A send and its receive**: the sender posts its tensor's element count and dtype under
  (group, src, dst, tag, n-th such send) before sending; the receiver compares before a blocking
  receive (the sender posts before it sends, so that wait is no longer than the receive's), and
  at its ``Work.wait()`` for an ``irecv`` (at once if the sender has posted already). While it
  waits it watches the sender's slot, as a subgroup's members do: a sender blocked in a send
  of another tag or on another group, a receive from this rank or a collective that needs it
  cannot post, and the receiver raises, naming both calls; unless this rank has an ``isend`` or
  ``irecv`` involving that sender in flight, which may yet answer its send or receive.

On a group of every rank, collectives are compared in the order each rank issues them, whatever
their group: two groups over the same ranks (or the default group and another of every rank)
used in different orders by different ranks fail the check, even where every call was
``async_op=True`` and torch would complete them.

Not checked: a backend object smaller than the world (torch never registered its ranks), a
receive from any source (and a later receive from that sender may then be compared with the
message before its own), ``monitored_barrier`` (it exists to name a missing rank), and the
hashed names of groups that ``use_local_synchronization`` or ``split_group`` made (such groups
are told apart by their ranks only: ``signatures.group_name``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from refddp.testing import rank_lists
from refddp.testing.checks import signatures
from refddp.testing.checks.board import Board
from refddp.testing.slots import ASYNC_WAIT, read_slot, sequence_key, slot_path_for

PAIRING_LIMIT = 64  # ranks: past it all_to_all's pairing is not checked (a W x W all-reduce)
TEXT_BYTES = 1024  # of each rank's description, all-gathered on a mismatch
# A peer seen this long in a call that needs this rank, and that this rank has not entered,
# cannot come (less than the driver's ONE_SIDED_CONFIRM_S, which would report it less well).
CONFLICT_CONFIRM_S = 1.0
# The pauses between two looks at the store while waiting: short at first (most posts come
# within a millisecond: a blocking receive waits for its send's), longer past POLL_SOON_S.
POLL_MIN_S, POLL_SOON_S, POLL_SOON_MAX_S, POLL_MAX_S = 0.00002, 0.1, 0.001, 0.02
SLOT_LOOK_S = 0.01  # how often a waiting rank reads its peers' slots
# Said where two ranks' calls name the same ranks but torch's groups differ.
SAME_RANKS_APART = ("two different groups over the same ranks (each new_group call makes "
                    "another communicator, numbered in the order made)")  # fmt: skip
_GROUP_TEXT = re.compile(r"group=\[[^\]]*\]")


class CollectiveMismatch(RuntimeError):
    """Ranks issued different collectives at the same point on the same group."""


_store: Any = None  # the pool's store, under our own prefix; None: subgroups and pairs unchecked
_workdir: str | None = None  # where the ranks' slot files are
_board: Board | None = None  # where groups of every rank compare their hashes
_task = 0
_group_counts: dict[str, int] = {}
_entered: dict[str, int] = {}  # calls this rank entered on each group (slots.sequence_key)
_p2p_counts: dict[tuple, int] = {}


def configure(store: Any, workdir: str | None) -> None:
    """Check subgroups and point-to-point calls through ``store`` (the pool's); ``workdir``
    holds the ranks' slot files and the board of groups of every rank (kept, with its count of
    rounds, when the pool's group is joined again: every rank has made the same rounds)."""
    global _store, _workdir, _board
    import torch.distributed as dist

    _store = dist.PrefixStore("refddp-check/", store) if store is not None else None
    _workdir = workdir
    if workdir is None:
        return
    size, rank = dist.get_world_size(), dist.get_rank()
    if _board is None or (_board.workdir, _board.size, _board.rank) != (workdir, size, rank):
        if _board is not None:
            _board.close()
        _board = Board(workdir, size, rank)


def replace_torchs_group_check() -> None:
    """Leave the groups a test makes unwrapped, as the pool's own are: under
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch wraps each new group in its ``ProcessGroupWrapper``,
    which crashes DDP on gloo (a SIGSEGV in torch 2.13: DDP's logger casts the wrapper to
    ProcessGroupGloo) and refuses calls torch allows (a broadcast of the same element count in
    another shape, reduce_scatter parts of each rank's own size); this check covers every group
    in its place. torch has no public switch for the wrapper alone (the debug level also turns on
    DDP's, FSDP's and pipelining's DETAIL checks, which stay on), so its private factory is
    replaced; on a torch without it, new groups are wrapped as before."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    if hasattr(c10d, "_create_process_group_wrapper"):
        c10d._create_process_group_wrapper = lambda wrapped_pg, *args, **kwargs: wrapped_pg


def new_task() -> None:
    """Start numbering each group's collectives and each pair's sends afresh (every rank of a
    pool runs every task, so each task's keys are the same on every rank)."""
    global _task
    _task += 1
    _group_counts.clear()
    _entered.clear()
    _p2p_counts.clear()


def _told_apart(listed: list[tuple[int, str, str]], why: str = "") -> CollectiveMismatch:
    """The mismatch of ``listed`` (rank, "#N description", its group's number), where two
    groups over the same ranks, whose calls describe alike, are told apart by their numbers:
    calls that read the same but for the group, or a send and a receive on the same ranks'
    two groups, each say their group's number, and why."""

    def call(text: str) -> str:  # without its "#N"
        return text.split(" ", 1)[-1]

    numbers: dict[str, set[str]] = {}
    for _, text, name in listed:
        numbers.setdefault(call(text), set()).add(name)
    alike = {text for text, names in numbers.items() if len(names - {""}) > 1}
    kinds = {call(text).split("(", 1)[0].removeprefix("i") for _, text, _ in listed}
    groups = {found.group(0) if (found := _GROUP_TEXT.search(text)) else ""
              for _, text, _ in listed}  # fmt: skip
    named = {name for _, _, name in listed} - {""}
    pair = len(listed) == 2 and kinds == {"recv", "send"} and len(groups) == 1 and len(named) == 2
    if alike or pair:
        listed = [(rank, f"{text} on group '{name}'" if name and (pair or call(text) in alike)
                   else text, name) for rank, text, name in listed]  # fmt: skip
        why = why or SAME_RANKS_APART
    return _mismatch([(rank, text) for rank, text, _ in sorted(listed)], why)


def enter(members: str, named: str) -> int:
    """Count a call this rank enters on a group (``members`` as the slot writes them, and its
    number); its position there, 1 for the first."""
    key = sequence_key(members, named)
    position = _entered[key] = _entered.get(key, 0) + 1
    return position


def _mismatch(listed: list[tuple[int, str]], why: str = "") -> CollectiveMismatch:
    groups = rank_lists.group(listed)
    text = "; ".join(
        f"{rank_lists.who(ranks)} {'is' if len(ranks) == 1 else 'are'} running {what}"
        for ranks, what in groups
    )
    return CollectiveMismatch(
        f"Detected mismatch between collectives on ranks: {text}" + (f": {why}" if why else "")
    )


def _scope(group: Any, world_size: int) -> tuple[list[int] | None, int] | None:
    """Where the check of a collective on ``group`` runs: (None, this rank's group rank) for a
    group of every rank, (its global ranks, this rank's group rank) for a subgroup, None where
    its ranks are unknown."""
    ranks = signatures.group_ranks(group)
    if ranks is None:
        import torch.distributed as dist

        return None, dist.get_rank()
    if isinstance(ranks, str):  # built from a backend class: its ranks were never registered
        return (None, group.rank()) if group.size() == world_size else None
    import torch.distributed as dist

    index = ranks.index(dist.get_rank())
    return (None, index) if len(ranks) == world_size else (ranks, index)


def check(checker: Any, name: str, call: dict[str, Any], display: str, count: int,
          named: str = "") -> None:  # fmt: skip
    """Compare this collective with the other ranks' of its group; raise on a mismatch.
    ``named``: its group's number (``signatures.group_name``)."""
    import torch.distributed as dist

    world_size = dist.get_world_size()
    scope = _scope(call.get("group"), world_size)
    if scope is None:
        return
    members, index = scope
    size = world_size if members is None else len(members)
    fingerprint = signatures.fingerprint(name, call, named)
    pairs = signatures.pairing(name, call, size)
    # The lint reads ``members`` as rank-dependent (``_scope`` returns this rank's index beside
    # it); it is the group's, the same on every rank that makes the call.
    if members is None:
        _on_world(  # refddp: ignore[RDL101]
            checker, fingerprint, display, count, pairs, index, call.get("group"), named
        )
    elif _store is not None:
        _on_subgroup(members, index, call.get("group"), fingerprint, display, count, pairs,
                     named)  # fmt: skip


Pairs = tuple[list[int], list[int]]


def _on_world(checker: Any, fingerprint: str, display: str, count: int, pairs: Pairs | None,
              index: int, group: Any, named: str) -> None:  # fmt: skip
    """A 56-bit hash of each rank's fingerprint, compared on the pool's board."""
    import torch
    import torch.distributed as dist

    assert _board is not None  # (enable_fingerprint_check refuses a checker without a workdir)
    digest = int.from_bytes(hashlib.blake2b(fingerprint.encode(), digest_size=7).digest(), "big")
    # The lint reads ``_board`` as rank-dependent (made where this rank's differs); its
    # answer is every rank's: each compares all ranks' digests.
    if not _board.all_alike(digest):
        _name_the_mismatch(checker, display, count, named=named)  # refddp: ignore[RDL101]
    world_size = dist.get_world_size(checker)
    if pairs is not None and world_size <= PAIRING_LIMIT:
        # Row i of each matrix is group rank i's: what it sends each rank, what it expects.
        sizes = torch.zeros(2, world_size, world_size, dtype=torch.int64)
        sizes[0, index], sizes[1, index] = torch.tensor(pairs[0]), torch.tensor(pairs[1])
        dist.distributed_c10d.all_reduce(sizes, group=checker)  # refddp: ignore[RDL101]
        ranks = signatures.group_ranks(group)
        ranks = ranks if isinstance(ranks, list) else list(range(world_size))
        why = signatures.unpaired(sizes[0].tolist(), sizes[1].tolist(), ranks)
        if why:
            _name_the_mismatch(checker, display, count, why, named)  # refddp: ignore[RDL101]


def _name_the_mismatch(checker: Any, display: str, count: int, why: str = "", named: str = ""
                       ) -> None:  # fmt: skip
    """All-gather every rank's description, count and group name, and raise naming each
    distinct description with the ranks running it (an all-gather of every rank's text costs
    several times a board round on many ranks: only on a mismatch)."""
    import torch
    import torch.distributed as dist

    data = f"{named}\x1f{display}".encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b"\0")
    mine = torch.frombuffer(bytearray(data + count.to_bytes(8, "little")), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(checker))]
    dist.distributed_c10d.all_gather(everyone, mine, group=checker)
    raw = [bytes(t.tolist()) for t in everyone]
    seen = [r[:TEXT_BYTES].rstrip(b"\0").decode(errors="replace").partition("\x1f") for r in raw]
    counts = [int.from_bytes(r[TEXT_BYTES:], "little") for r in raw]
    raise _told_apart([(r, f"#{counts[r]} {text}", name) for r, (name, _, text) in enumerate(seen)],
                      why)  # fmt: skip


def _group_key(group: Any) -> str:
    """A subgroup's name, the same on every member (its ranks where torch has no name)."""
    name = getattr(group, "group_name", None)
    if name:
        return str(name)
    return ",".join(map(str, signatures.group_ranks(group) or ()))


def _on_subgroup(members: list[int], index: int, group: Any, fingerprint: str, display: str,
                 count: int, pairs: Pairs | None, named: str) -> None:  # fmt: skip
    """Through the store: every member posts its record, the group's rank 0 compares them and
    posts the verdict, every member raises on a mismatch."""
    key = _group_key(group)
    n = _group_counts[key] = _group_counts.get(key, 0) + 1
    base = f"{_task}/{key}/{n}/"
    _store.set(base + str(index), json.dumps([fingerprint, display, count, pairs]))
    if index == 0:
        posts = [base + str(i) for i in range(len(members))]
        _wait_for(posts, members, display, count, named)
        records = [json.loads(v) for v in _store.multi_get(posts)]
        verdict = _verdict(records, members)
        _store.set(base + "verdict", verdict)
        if n > 1:  # every member read it: each posted this collective's record after
            _store.delete_key(f"{_task}/{key}/{n - 1}/verdict")
    else:
        _wait_for([base + "verdict"], members, display, count, named)
        verdict = _store.get(base + "verdict").decode()
    _store.delete_key(base + str(index))  # (rank 0 has read it: the verdict is out)
    if verdict:
        raise CollectiveMismatch(verdict)


def _verdict(records: list[list], members: list[int]) -> str:
    """"" if the members' records agree (and all_to_all's sizes pair up), else the message."""
    listed = [(members[i], f"#{r[2]} {r[1]}") for i, r in enumerate(records)]
    if len({r[0] for r in records}) > 1:
        return str(_mismatch(listed))
    if records[0][3] is not None:
        why = signatures.unpaired([r[3][0] for r in records], [r[3][1] for r in records], members)
        if why:
            return str(_mismatch(listed, why))
    return ""


def _wait_for(keys: list[str], members: list[int], display: str, count: int, named: str = ""
              ) -> None:  # fmt: skip
    """Until every key is in the store. Meanwhile, look at the other members' slots (the
    group's, or a receive's sender): a member blocked in another call that needs this rank
    can never post (a certain hang), and this rank raises naming both calls. ``named``: the
    name of this call's group (``signatures.group_name``)."""
    import torch.distributed as dist

    me, pause, seen = dist.get_rank(), POLL_MIN_S, {}
    started = looked = time.monotonic()
    while not _store.check(keys):
        now = time.monotonic()
        if now - looked >= SLOT_LOOK_S:  # (a slot file read costs as much as a store look)
            looked = now
            for member in members:
                conflict = _conflict(member, me, members, named) if member != me else None
                if not conflict or seen.get(member, (None,))[0] != conflict:
                    seen[member] = (conflict, now)
                elif now - seen[member][1] >= CONFLICT_CONFIRM_S:
                    raise _told_apart([(me, f"#{count} {display}", named), (member, *conflict)])
        time.sleep(pause)  # a store look is a round trip: back off, the more the longer it waits
        pause = min(pause * 2, POLL_MAX_S if now - started > POLL_SOON_S else POLL_SOON_MAX_S)


def _conflict(member: int, me: int, members: list[int], named: str) -> tuple[str, str] | None:
    """What ``member`` is blocked in (its description and group's name), if that is a call
    on another group than this one (``named``; other ranks, or the same ranks' other group),
    issued there and then (not an async one's wait: this rank may have issued it already),
    that needs this rank; else None."""
    if _workdir is None:
        return None
    slot = read_slot(slot_path_for(_workdir, member))
    if not slot.inside or ASYNC_WAIT in slot.last:
        return None
    needs_me = slot.on_world or (slot.members is not None and me in slot.members)
    same_group = not slot.on_world and slot.members == frozenset(members)
    if same_group and slot.group and named:  # (a group with a number: the number tells)
        same_group = slot.group == named
    if not needs_me or same_group:
        return None
    if slot.position and _entered.get(slot.sequence, 0) >= slot.position:
        return None  # a call this rank has been in too: the member is finishing it
    if not slot.position and unwaited_with(member):
        return None  # a send or receive this rank's isend or irecv, in flight, may answer
    return slot.call, slot.group


def _nothing_in_flight(member: int) -> bool:
    return False


# Whether this rank has an async call involving a rank that it has not waited on yet:
# ``collectives.in_flight_with``, set there (it tracks them, and imports this module).
unwaited_with: Callable[[int], bool] = _nothing_in_flight


# -- point to point ----------------------------------------------------------------------------


def _p2p_key(group: Any, src: int, dst: int, tag: int) -> str | None:
    """The store key of the next message from ``src`` to ``dst`` (global ranks) with ``tag``
    on ``group``; None where the group's ranks are unknown."""
    ranks = signatures.group_ranks(group)
    if isinstance(ranks, str):
        return None
    where = "world" if ranks is None else _group_key(group)
    pair = (where, src, dst, tag)
    n = _p2p_counts[pair] = _p2p_counts.get(pair, 0) + 1
    return f"p2p/{_task}/{where}/{src}>{dst}/{tag}/{n}"


def before_send(call: dict[str, Any], display: str, count: int) -> None:
    """Post what this send carries, for its receiver to compare (before it is sent)."""
    import torch.distributed as dist

    dst = signatures.peer(call, "dst")
    if _store is None or dst is None:
        return
    me = dist.get_rank()
    key = _p2p_key(call.get("group"), me, dst, int(call.get("tag") or 0))
    if key is not None:
        _store.set(key, json.dumps([signatures.payload(call), display, count, me]))


class Receive:
    """A receive's comparison with its send: ``posted()`` says whether the sender has posted
    yet; calling it waits for that post (the sender posts before it sends, so no longer than
    the data takes), then raises on a mismatch."""

    def __init__(self, key: str, call: dict[str, Any], display: str, count: int, sender: int):
        self.key, self.call, self.display, self.count = key, call, display, count
        self.sender = sender

    def posted(self) -> bool:
        return bool(_store.check([self.key]))

    def __call__(self) -> None:
        import torch.distributed as dist

        # Watching the sender meanwhile: blocked in another call that needs this rank (a send
        # of another tag, on another group, a receive from this rank), it never posts.
        named = signatures.group_name(self.call.get("group"))
        _wait_for([self.key], [self.sender], self.display, self.count, named)
        sent, sent_display, sent_count, sender = json.loads(_store.get(self.key))
        _store.delete_key(self.key)
        if sent != signatures.payload(self.call):
            mine = (dist.get_rank(), f"#{self.count} {self.display}")
            raise _mismatch(sorted([(sender, f"#{sent_count} {sent_display}"), mine]))


def receive_check(call: dict[str, Any], display: str, count: int) -> Receive | None:
    """The comparison of this receive with its send, or None where it cannot be checked (no
    store, a receive from any source, a group whose ranks are unknown)."""
    import torch.distributed as dist

    src = signatures.peer(call, "src")
    if _store is None or src is None:
        return None
    key = _p2p_key(call.get("group"), src, dist.get_rank(), int(call.get("tag") or 0))
    return Receive(key, call, display, count, src) if key is not None else None
