"""Python's and numpy's global random states: the process-wide streams a user's dataset,
augmentation or model code may draw from besides torch's.

torch's generators are seeded and restored where refddp draws from them (``SeededFetch``, the
checkpoint's ``rng_states``). These two are seeded at a run's start and at a resume at another
world size (``seed``), and saved and put back (``states`` / ``set_states``) around a draw that
must not move them (the first batch a loss checks, a batch fetched ahead of its step) and by a
checkpoint (``refddp/checkpoints/run_state.py``, which stores them in weights-only types). They
live in ``launch`` because the workload, the checkpoints and the training all use them.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def seed(value: int) -> None:
    """Seed both from ``value`` (modulo 2**64 and 2**32: Python seeds with ``abs``, which
    would give -1 and 1 one stream): a fresh run's in-process draws (a dataset fetched in
    this process, ``--num-workers 0``) are then the same every run. Loader workers seed
    their own from the loader's generator."""
    random.seed(value % 2**64)
    np.random.seed(value % 2**32)


def states() -> tuple[Any, Any]:
    """(Python's state, numpy's state), as their own ``getstate`` functions return them."""
    return random.getstate(), np.random.get_state()


def set_states(saved: tuple[Any, Any]) -> None:
    """Put back what ``states`` returned."""
    random.setstate(saved[0])
    np.random.set_state(saved[1])
