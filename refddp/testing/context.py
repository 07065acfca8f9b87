"""The types that the driver, the ranks and test code share."""

from __future__ import annotations

from refddp.dist import DistContext

__all__ = ["DistContext", "RankFailure", "RankSkipped", "RankTimeout"]


class RankFailure(AssertionError):
    """One or more ranks raised, exited or were killed.

    ``failures`` maps rank -> the text explaining that rank's failure (remote traceback, or
    exit code / signal); ``str()`` also carries each rank's captured output tail.
    """

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = dict(failures)


class RankTimeout(RankFailure):
    """The deadline passed; ``failures`` maps each unfinished rank to its stack at that moment."""


class RankSkipped(Exception):
    """A rank asked to skip the task (``pytest.skip`` inside it); the plugin turns it back into
    a skip, so the driver side needs no pytest."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
