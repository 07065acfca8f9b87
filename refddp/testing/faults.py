"""Faults injected into ranks at an exact point: the k-th collective a rank enters, or a named
``fault_point`` in user code.

    from refddp.testing import faults
    spawn(train, faults=[faults.kill(1, at=3)])          # SIGKILL inside rank 1's 3rd collective
    @pytest.mark.faults(faults.delay(0, "eval", 2.0))   # rank 0 reaches fault_point("eval") late

``at`` counts as the harness's collective record counts (``collectives.py``: every collective
issued through ``torch.distributed``, from #1 in each task, as "#N" in every report). Under
fingerprint checking (the default) a fault fires after collective #k's fingerprint exchange, so
every rank has entered #k and finished all before it; the rank is then inside #k (past its
fingerprint exchange, before the backend's op), and its peers wait in it: no rank completes #k.
A fault that fires writes one line to its rank's record file before acting (so a killed rank's
fault is still reported); the driver reads them to name the cause of a failure, and fails a
test whose fault never fired. This module imports nothing heavy: ``fault_point`` is called
from user code, where it is a no-op outside the harness.
"""

from __future__ import annotations

import numbers
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from refddp.config.validation import MAX_WAIT_S

__all__ = ["Fault", "cut_node", "delay", "error", "exit", "fault_point", "hang", "kill",
           "kill_node"]


class Fault(NamedTuple):
    """One fault: what it does (``kind``), on which ``rank``, and where (``at``)."""

    kind: str  # kill | error | hang | exit | delay | cut; kill_node | cut_node before expand
    rank: int  # (a node fault's node until ``expand``)
    at: int | str  # the k-th collective (1-based), or a fault_point name
    value: Any = None  # error: the message; exit: the code; delay: seconds

    def where(self) -> str:
        return f"collective #{self.at}" if isinstance(self.at, int) else f"fault point {self.at!r}"

    def describe(self) -> str:
        if self.kind in NODE_FAULTS:
            return f"{self.kind} node {self.rank} at {self.where()}"
        return f"{self.kind} rank {self.rank} at {self.where()}{_node_of(self)}"


def _node_of(fault: Fault) -> str:
    """`` (node 1)`` for the rank fault that acts out a node fault, else ``""``."""
    return f" ({fault.value[0]})" if fault.kind in ("kill", "cut") and fault.value else ""


def _fault(kind: str, rank: int, at: int | str, value: Any = None) -> Fault:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"faults.{kind}: rank must be an int >= 0, not {rank!r}")
    if isinstance(at, bool) or not isinstance(at, int | str) or (isinstance(at, int) and at < 1):
        raise ValueError(
            f"faults.{kind}: at must be a collective number >= 1 or a fault_point name, not {at!r}"
        )
    return Fault(kind, rank, at, value)


def kill(rank: int, at: int | str) -> Fault:
    """SIGKILL ``rank`` while it is inside collective ``at`` (or at fault point ``at``)."""
    return _fault("kill", rank, at)


def error(rank: int, at: int | str, message: str = "injected error") -> Fault:
    """Raise ``RuntimeError(message)`` on ``rank`` there."""
    return _fault("error", rank, at, message)


def hang(rank: int, at: int | str) -> Fault:
    """Block ``rank`` there for good: its peers wait, and the deadline reports it."""
    return _fault("hang", rank, at)


def exit(rank: int, at: int | str, code: int = 1) -> Fault:  # noqa: A001 - the public name
    """End ``rank``'s process there with exit code ``code`` (0-255: what a process can exit
    with; a larger one would be reported as another, ``code % 256``)."""
    if not (isinstance(code, numbers.Integral) and not isinstance(code, bool) and 0 <= code <= 255):
        raise ValueError(f"faults.exit: code must be an int from 0 to 255, not {code!r}")
    return _fault("exit", rank, at, int(code))


def delay(rank: int, at: int | str, seconds: float) -> Fault:
    """A straggler: ``rank`` reaches that point ``seconds`` late, and the collective completes."""
    number = isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)
    if not (number and 0 <= seconds <= MAX_WAIT_S):  # (NaN fails too; sleep fails past it)
        raise ValueError(
            f"faults.delay: seconds must be a number >= 0, at most a week, not {seconds!r}"
        )
    return _fault("delay", rank, at, float(seconds))


NODE_FAULTS = ("kill_node", "cut_node")


def kill_node(node: int, at: int | str) -> Fault:
    """Node ``node`` dies as its first rank enters collective ``at``: every process of its ranks
    (their children too) is SIGKILLed at once (needs ``nnodes``); the report says ``node N
    lost``, with its ranks."""
    return _fault("kill_node", node, at)


def cut_node(node: int, at: int | str) -> Fault:
    """Node ``node``'s cable is pulled (its switch port goes down: packets lost, no reset sent)
    as the node's first rank enters collective ``at`` (real nodes only: ``real_nodes=True``);
    every rank then waits in it until the deadline, which reports the hang with the cut named."""
    return _fault("cut_node", node, at)


def check_node_faults(faults: tuple[Fault, ...], nnodes: int | None, real_nodes: bool) -> None:
    """A ValueError in one line for a node fault the pool cannot act out (before it starts)."""
    for fault in faults:
        if fault.kind not in NODE_FAULTS:
            continue
        if nnodes is None or fault.rank >= nnodes:
            have = f"{nnodes} node(s)" if nnodes else "no nodes (nnodes=None)"
            raise ValueError(f"faults.{fault.kind}: no node {fault.rank}: the pool has {have}")
        if fault.kind == "cut_node" and not real_nodes:
            raise ValueError("faults.cut_node needs real nodes (real_nodes=True): a simulated "
                             "node has no link of its own")  # fmt: skip


def expand(faults: tuple[Fault, ...], ranks_of_node: list[list[int]] | None, pids: list[int],
           cut_command: Callable[[int], list[str]] | None) -> tuple[Fault, ...]:  # fmt: skip
    """Node faults as the one rank fault that acts each out, on the node's first rank, labelled
    with its node: a kill that takes every process of the node's ranks (all at once, as a
    machine dies: no node-mate gets to fail on its own first), or a cut (``cut_command``, on
    real nodes only)."""
    nnodes = len(ranks_of_node) if ranks_of_node else None
    check_node_faults(faults, nnodes, cut_command is not None)
    out: list[Fault] = []
    for fault in faults:
        if fault.kind not in NODE_FAULTS:
            out.append(fault)
            continue
        ranks = (ranks_of_node or [])[fault.rank]
        label = f"node {fault.rank}"
        if fault.kind == "kill_node":
            out.append(Fault("kill", ranks[0], fault.at, (label, tuple(pids[r] for r in ranks))))
        else:
            assert cut_command is not None  # (checked above)
            out.append(Fault("cut", ranks[0], fault.at, (label, tuple(cut_command(fault.rank)))))
    return tuple(out)


def _kill_group(pid: int) -> None:
    """SIGKILL ``pid``'s process group (a rank and what it started), or just ``pid``."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- rank side ---------------------------------------------------------------------------------

_armed: list[Fault] = []  # this rank's faults for the current task, not yet fired
_record_path: str | None = None


def record_path_for(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.faults")


def arm(faults: tuple[Fault, ...], rank: int, record_path: str) -> None:
    """On a rank, at the start of a task: this rank's faults (the others' are ignored)."""
    global _record_path
    _armed[:] = [f for f in faults if f.rank == rank]
    _record_path = record_path


def disarm() -> None:
    _armed.clear()


def due_at_collective(count: int) -> Fault | None:
    """The armed fault for collective #count, taken off the armed list, or None."""
    for fault in _armed:
        if fault.at == count:
            _armed.remove(fault)
            return fault
    return None


def fire(fault: Fault, where: str, call: Callable[[], Any] | None = None) -> Any:
    """Act out ``fault`` at ``where`` ("collective #3 all_reduce(...)"). ``call`` runs the
    collective itself: a delay lets it complete late; the other faults never run it, so no
    rank completes collective #k (a peer's result never depends on how far a dying rank got)."""
    node = _node_of(fault)
    with open(_record_path or os.devnull, "a") as record:
        record.write(f"{fault.kind} rank {fault.rank} at {where}{node}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if fault.kind == "cut":  # the node's cable pulled: its switch port down (root, as the pool)
        done = subprocess.run(list(fault.value[1]), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"faults.cut_node: {' '.join(fault.value[1])}: "
                               f"{done.stderr.strip() or done.returncode}")  # fmt: skip
    if fault.kind == "kill" and node:  # the whole node: its other ranks first, then this one
        for pid in fault.value[1]:
            if pid != os.getpid():
                _kill_group(pid)
        _kill_group(os.getpid())
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "error":
        raise RuntimeError(fault.value)
    if fault.kind == "exit":
        os._exit(fault.value)
    if fault.kind == "hang":
        threading.Event().wait()
    if fault.kind == "delay":
        time.sleep(fault.value)  # the straggler's lateness is the fault itself
    return call() if call is not None else None


def fault_point(name: str) -> None:
    """A named point where a test may inject a fault (``faults.kill(1, "name")``...).

    A no-op outside the harness, and on ranks with no fault armed for ``name``.
    """
    for fault in _armed:
        if fault.at == name:
            _armed.remove(fault)
            fire(fault, f"fault point {name!r}")
            return


# -- driver side -------------------------------------------------------------------------------


def fired_faults(workdir: str, world_size: int) -> dict[int, list[str]]:
    """rank -> the faults it recorded firing in this task ("kill rank 1 at collective #3 ...")."""
    fired: dict[int, list[str]] = {}
    for rank in range(world_size):
        try:
            with open(record_path_for(workdir, rank)) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError:
            continue
        if lines:
            fired[rank] = lines
    return fired


def clear_records(workdir: str, world_size: int) -> None:
    for rank in range(world_size):
        try:
            os.unlink(record_path_for(workdir, rank))
        except FileNotFoundError:
            pass


def never_fired(faults: tuple[Fault, ...], fired: dict[int, list[str]]) -> list[Fault]:
    """The faults no rank recorded firing."""
    missing = []
    for fault in faults:
        prefix = f"{fault.kind} rank {fault.rank} at {fault.where()}"
        lines = fired.get(fault.rank, ())
        if not any(ln == prefix or ln.startswith(prefix + " ") for ln in lines):
            missing.append(fault)
    return missing
