"""Each rank's slot: a small memory-mapped file saying which collective the rank is in.

The rank writes it on every collective it enters (``collectives.py``) and the driver reads it,
even while the rank is blocked, to explain a hang or a failure (``reports.py``, ``tasks.py``);
a rank waiting in a subgroup's fingerprint check reads its peers' to tell a wait that can end
from one that cannot (``checks/fingerprint.py``). Reading imports nothing heavy.
"""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

SLOT_BYTES = 1024
STATE_OUTSIDE, STATE_INSIDE = b"-", b"I"  # who it waits on is the slot's members field
ASYNC_WAIT = " (async, in wait())"  # ends the text of an async collective waited on


class SlotReading(NamedTuple):
    last: str  # "#3 barrier() at file.py:12 in step", or "" before the first collective
    inside: bool  # still blocked in it
    on_world: bool  # it involves every rank of the default group
    members: frozenset[int] | None = None  # else the global ranks it needs; None if unknown
    entered: int = 0  # collectives the rank entered in the task so far
    group: str = ""  # its group's number (``signatures.group_name``; "": default, or unknown)
    position: int = 0  # it is the rank's n-th call on its group this task (0: point to point)

    @property
    def call(self) -> str:
        """The last call without where it was made: "#3 barrier()"."""
        return self.last.split(" at ", 1)[0]

    @property
    def sequence(self) -> str:
        """The group whose calls ``position`` counts (``sequence_key``)."""
        if self.on_world or self.members is None:
            return sequence_key("*" if self.on_world else "?", self.group)
        return sequence_key(",".join(map(str, self.members)), self.group)


def sequence_key(members: str, group: str) -> str:
    """Which group a call's position counts on: its members as the slot writes them ("*":
    every rank) and its group's number, so that two groups over the same ranks count apart."""
    if members not in ("*", "?", ""):
        members = ",".join(sorted(members.split(","), key=int))
    return f"{members}|{group}"


def slot_path_for(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.collective")


class Slot:
    """This rank's slot, open for writing."""

    def __init__(self, path: str):
        with open(path, "w+b") as f:
            f.truncate(SLOT_BYTES)
            self._map = mmap.mmap(f.fileno(), SLOT_BYTES)
        self.write(STATE_OUTSIDE, "", 0)

    def write(self, state: bytes, text: str, count: int, members: str = "*", group: str = "",
              position: int = 0) -> None:  # fmt: skip
        """The state byte, who the collective waits on ("*", "0,2" or "?": a list too long for
        the slot counts as unknown), its group's number (``signatures.group_name``), its
        position on that group, the task's collective count, then the text the reports show,
        separated by unit separators."""
        if len(members) > SLOT_BYTES // 2:
            members = "?"
        fields = f"{members}\x1f{group}\x1f{position}\x1f{count}\x1f{text}".encode()
        data = (state + fields)[: SLOT_BYTES - 1]
        self._map[:] = data + b"\0" * (SLOT_BYTES - len(data))

    def leave(self) -> None:
        """Mark the rank as out of its collective; the rest stays for the reports."""
        if self._map[:1] != STATE_OUTSIDE:
            self._map[:1] = STATE_OUTSIDE


def read_slot(slot_path: str) -> SlotReading:
    """The last collective a rank entered, as written to its slot file. The rank may be
    writing it meanwhile: a torn read gives a garbled text and unknown members, never an
    error."""
    try:
        with open(slot_path, "rb") as f:
            data = f.read(SLOT_BYTES)
    except OSError:
        return SlotReading("", False, False)
    state, rest = data[:1], data[1:].split(b"\0", 1)[0].decode(errors="replace")
    who, _, rest = rest.partition("\x1f")
    group, _, rest = rest.partition("\x1f")
    position, _, rest = rest.partition("\x1f")
    count, _, text = rest.partition("\x1f")
    members = None
    try:
        if who not in ("*", "?", ""):
            members = frozenset(int(r) for r in who.split(","))
        entered, at = int(count or 0), int(position or 0)
    except ValueError:
        members, entered, at = None, 0, 0
    # Who the collective waits on stays written after it returned or raised (only the state
    # byte is reset): a failed rank's report can still tell which ranks its collective needed.
    return SlotReading(text, state != STATE_OUTSIDE, who == "*", members, entered, group, at)
