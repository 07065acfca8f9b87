"""Where the ranks of a pool compare a collective's fingerprint for a group of every rank: a file
in the pool's work directory, instead of an all-reduce.

A pool's ranks all run on one machine (its work directory holds their slot files too), so they
can share memory. A one-number gloo all-reduce waits for each rank in turn to be scheduled: at
1,024 ranks on 2 cores it took ~0.5 s, as long as the test's own collective (benchmarks/README.md,
"Harness at scale"). Here each rank writes one cell, and all but the last to arrive sleep in a
read until it wakes them.

A round: every rank writes its hash into its own cell of the round's half of the board, then
counts itself in under a lock; the last to arrive sets the count back to 0 and wakes the others,
one byte each through the half's FIFO; then every rank reads every cell. Rounds alternate
between the two halves: a rank can start round k+2 only once round k+1 is complete, and round
k+1 completes only when every rank has woken from round k, so no rank overwrites a cell, or
takes a wake-up byte, that another still needs.

A rank that never comes (it died, or skipped the collective) leaves the others asleep until the
driver stops them: hangs and failures are the driver's to report, from the ranks' slots and
replies. A rank taken out of a round midway (a signal handler that raises while it waits) breaks
the board: its next round raises, so the task fails and its pool is closed, rather than a later
round reading a wake-up byte or cells meant for another.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct

CELL = struct.Struct("<q")  # a 56-bit hash, or a count


class Board:
    """This rank's side of the pool's board: ``size`` ranks, this one ``rank``."""

    def __init__(self, workdir: str, size: int, rank: int):
        self.workdir, self.size, self.rank = workdir, size, rank
        self.rounds = 0  # the same on every rank: each round needs them all
        self.broken = False
        length = CELL.size * 2 * (1 + size)  # two counts, then two halves of ``size`` cells
        self._fd = os.open(os.path.join(workdir, "check-board"), os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < length:
            os.ftruncate(self._fd, length)  # (zeros; every rank sets the same length)
        self._cells = mmap.mmap(self._fd, length)
        self._wake = []
        for half in (0, 1):
            path = os.path.join(workdir, f"check-wake-{half}")
            try:
                os.mkfifo(path, 0o600)
            except FileExistsError:  # another rank made it
                pass
            # Read and write: the open does not wait for a writer, and a read never sees EOF.
            self._wake.append(os.open(path, os.O_RDWR))

    def all_alike(self, digest: int) -> bool:
        """Post ``digest``, wait for every rank's of this round, and say whether they are all
        equal to it (the same answer on every rank)."""
        if self.broken:
            raise RuntimeError("the pool's check board is broken: this rank left a round midway")
        self.broken = True  # until the round is done
        half, self.rounds = self.rounds % 2, self.rounds + 1
        cells = CELL.size * (2 + half * self.size)
        CELL.pack_into(self._cells, cells + CELL.size * self.rank, digest)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            count = CELL.unpack_from(self._cells, CELL.size * half)[0] + 1
            last = count == self.size
            CELL.pack_into(self._cells, CELL.size * half, 0 if last else count)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if last:
            wake = memoryview(b"\0" * (self.size - 1))
            while wake:  # (a pipe takes a large write in parts)
                wake = wake[os.write(self._wake[half], wake) :]
        else:
            os.read(self._wake[half], 1)
        alike = self._cells[cells : cells + CELL.size * self.size] == CELL.pack(digest) * self.size
        self.broken = False
        return alike

    def close(self) -> None:
        self._cells.close()
        for fd in (self._fd, *self._wake):
            os.close(fd)
