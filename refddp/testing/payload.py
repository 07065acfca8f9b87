"""A task's call as bytes for the ranks: functions by reference where they can be, by value
(cloudpickle) where they cannot.

Module-level functions of test files and installed packages pickle by reference, and the
ranks import them. Lambdas, closures and functions nested in a test cannot be found by name,
so cloudpickle sends them whole, with the values they capture (the ``test`` extra installs it).
What neither can send (a lock, an open file) is a one-line TypeError naming it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any


def pickle_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bytes:
    """``(fn, args, kwargs)`` pickled, or a TypeError naming what cannot be sent."""
    __tracebackhide__ = True  # pytest shows the test's spawn call, then the one line
    try:
        return pickle.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - retried by value below
        by_reference = exc
    try:
        import cloudpickle
    except ImportError:
        raise TypeError(
            f"cannot send {_name(fn)} to the ranks by reference ({by_reference}); sending "
            "lambdas, closures and nested functions needs cloudpickle: pip install "
            "cloudpickle (or refddp[test])"
        ) from None
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - name the part that cannot be sent
        raise TypeError(f"cannot send {_culprit(fn, args, kwargs, cloudpickle)} to the ranks: "
                        f"{exc}") from None  # fmt: skip


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


def _culprit(fn: Any, args: tuple, kwargs: dict[str, Any], cloudpickle: Any) -> str:
    for key, value in kwargs.items():
        if not _sendable(value, cloudpickle):
            return f"argument {key!r} of {_name(fn)}"
    for i, value in enumerate(args):
        if not _sendable(value, cloudpickle):
            return f"positional argument {i} of {_name(fn)}"
    return _name(fn)


def _sendable(value: Any, cloudpickle: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001 - any pickling error
        return False
    return True
