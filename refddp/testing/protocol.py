"""The messages the driver (``driver/pool.py``, ``driver/tasks.py``) and each rank
(``rank/worker.py``) exchange, by name.

One private socket per rank carries them, pickled. Driver -> rank: ``RunTask``, ``Stop``.
Rank -> driver: ``Ready`` or ``InitError`` once, then one of ``Done`` / ``Failed`` /
``Skipped`` per task. ``Died`` is never sent: the driver makes it up when a rank's socket
closes, so that every rank answers every task with a message.
"""

from __future__ import annotations

import signal
from typing import Any, NamedTuple

# The signal a rank dumps every thread's stack on (faulthandler's, registered by the rank):
# a real-time signal, which no trainer or launcher takes for itself. SIGUSR1, the obvious
# choice, is SLURM's time-limit signal, which refddp's trainer and others handle (a stop
# request): a rank running one answered the driver's stack request by stopping, not dumping.
STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2

# Set in a rank while it loads the driver's script or test modules to find the task's function
# there: a pool started then is their top-level code running again in every rank (a fork
# bomb), so it is refused, as multiprocessing's spawn refuses a start during its bootstrap.
LOADING_DRIVER_MODULES = "REFDDP_LOADING_DRIVER_MODULES"


class Health(NamedTuple):
    """The rank's process group after a task: a pool whose ranks disagree is recycled."""

    initialized: bool
    world_size: int | None
    sequence: int | None  # the default group's collective count, C++-issued ones included
    unclean: tuple[str, ...] = ()  # what the task left behind that could not be cleaned up


class RunTask(NamedTuple):
    """Run ``payload`` (pickled ``(fn, args, kwargs)``) once on this rank."""

    payload: bytes
    sys_path: list[str]
    modules: list[tuple[str, str | None]]  # (module name, file) the payload refers to
    rank_fixtures: tuple[str, ...] = ()  # fixtures the rank creates and tears down itself
    faults: tuple[Any, ...] = ()  # faults.Fault: each rank arms its own
    node_dirs: tuple[str, ...] = ()  # with simulated nodes: node n's node_tmp_path
    # "module:function"s the rank calls (once per process) before it imports the test's
    # modules: what must hold when their classes are defined (torch_suites.py).
    before_import: tuple[str, ...] = ()


class Stop(NamedTuple):
    """Finish: save what must be saved (coverage data) and exit 0."""


class Ready(NamedTuple):
    """The rank joined the pool's process group."""


class InitError(NamedTuple):
    text: str


class Done(NamedTuple):
    result: bytes  # the pickled return value
    health: Health


class Failed(NamedTuple):
    text: str  # the remote traceback
    health: Health
    at: float = 0.0  # time.monotonic() when it failed (one clock for every process here)
    in_collective: str = ""  # the collective the exception came out of, if it did


class Skipped(NamedTuple):
    reason: str
    health: Health


class Died(NamedTuple):
    why: str  # "exited with code 7", "killed by signal SIGKILL"
    at: float = 0.0  # when the driver saw it go


Reply = Ready | InitError | Done | Failed | Skipped | Died
FAILURES = (InitError, Failed, Died)

# Fixtures a rank makes for itself for each task and undoes after it, instead of receiving the
# driver's value: this rank's context, and a monkeypatch whose changes must not outlive the test.
RANK_FIXTURES = ("dist_ctx", "monkeypatch")
