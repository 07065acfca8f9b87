"""``DistributedTestCase``: a home for ``unittest`` suites written for PyTorch's
``MultiProcessTestCase``.

Change the base class and the suite runs on the harness's warm pools: each test method (with
``setUp`` and ``tearDown``) runs on every rank of a ``world_size`` group, ``self.rank`` and
``self.world_size`` as there, failures reported by rank. What such suites do for themselves
keeps working: ``self._spawn_processes()`` in ``setUp`` is a no-op (the ranks exist);
``dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, ...)`` (any
``init_method`` or store, e.g. ``f"file://{self.file_name}"``) joins the pool's group, which is
already initialised, and ``dist.destroy_process_group()`` leaves it for the next test. Another
backend (``fake``, ``threaded``, a second gloo group is not asked for this way) is started for
real, on the test's own store or ``init_method``: the pool's group is set aside for it, and
joined again when the test ends, on every rank alike. ``self.file_name`` is one file
for the test, the same on every rank (a ``FileStore`` on it meets the other ranks). A rank that
exits with one of PyTorch's skip codes (``skip_if_lt_x_gpu``) skips the test, and a failing
assertion reaches the report as the exception it was. Runs under pytest (the plugin's
``--dist-timeout`` and ``--no-dist-debug`` apply) or ``python -m unittest``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import unittest
from collections.abc import Mapping
from typing import Any

from refddp.config.validation import seconds_error

DEFAULT_WORLD_SIZE = 4  # MultiProcessTestCase's


class DistributedTestCase(unittest.TestCase):
    """Run each test method on every rank of a process group (see the module's docstring)."""

    timeout: float | None = None  # seconds; None: --dist-timeout under pytest, else 60
    backend: str = "gloo"
    # "module:function"s each rank calls once before it imports the test's module (a pool's
    # RunTask.before_import): torch_suites.py's base class swap.
    rank_setup: tuple[str, ...] = ()
    precision: float = 0.0  # common_utils.TestCase's default tolerances, which its
    rel_tol: float = 0.0  # assertEqual reads (0: dtype-based defaults)

    def assertEqual(self, first: Any, second: Any, msg: Any = None, **kwargs: Any) -> None:  # noqa: N802
        """Tensor-aware, as PyTorch's suites expect: for tensors, arrays and containers of them
        (or with ``atol``, ``rtol``, ``exact_dtype``...), ``common_utils.TestCase.assertEqual``
        where the suite imported it, else ``torch.testing.assert_close``; unittest's for the
        rest. unittest's own compares tensors with ``==``, ambiguous past one element."""
        __tracebackhide__ = True
        if not (kwargs or _holds_tensor(first) or _holds_tensor(second)):
            super().assertEqual(first, second, msg)
            return
        torch_equal = _torch_assert_equal()
        if torch_equal is not None:
            torch_equal(self, first, second, msg, **kwargs)
        else:
            _assert_close(first, second, msg, **kwargs)

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    @property
    def rank(self) -> int:
        """This rank's in the pool (the same while a test's own group of another backend is
        up, or none is)."""
        from refddp.testing.context import rank_context

        here = rank_context()
        if here is not None:
            return here.rank
        import torch.distributed as dist

        return dist.get_rank()

    @property
    def file_name(self) -> str:
        """A file per test, the same on every rank, as MultiProcessTestCase gives for
        ``file://`` rendezvous and ``FileStore``s (the driver makes it; each rank is told)."""
        if not hasattr(self, "_file_name"):  # outside a pool run (python -m unittest on a rank)
            self._file_name = _new_file()
        return self._file_name

    def _spawn_processes(self) -> None:
        """MultiProcessTestCase's set-up step: the pool's ranks already run."""

    def _handle_test_skip(self, reason: str) -> None:
        """What PyTorch's ``skip_if_lt_x_gpu`` calls, where the test case has it (recent
        torch), instead of exiting the rank with a skip code (also handled: ``_torch_skip``)."""
        self.skipTest(reason)

    def run(self, result: unittest.TestResult | None = None) -> Any:
        from refddp.testing.context import rank_context

        if rank_context() is not None:  # on a rank: the method itself
            return super().run(result)
        return self._run_on_ranks(result)

    def _run_on_ranks(self, result: unittest.TestResult | None) -> Any:
        from refddp.testing.context import RankFailure, RankSkipped
        from refddp.testing.driver.tasks import DEFAULT_TIMEOUT_S
        from refddp.testing.driver.warm_pools import PoolKey, run_on_pool

        result = result if result is not None else self.defaultTestResult()
        result.startTest(self)
        try:
            refused = self._timeout_error()
            if refused:  # before any rank runs
                _report_in_one_line(self, result, refused)
                return result
            key = PoolKey(self.world_size, pool_backend(self.backend),
                          _option("dist_debug", True))  # fmt: skip
            deadline = self.timeout or _option("dist_timeout", DEFAULT_TIMEOUT_S)
            file_name = _new_file()
            case = (type(self), self._testMethodName, file_name)
            try:
                run_on_pool(key, run_case, case, {}, deadline,
                            extra_modules=(type(self).__module__,),
                            before_import=self.rank_setup)  # fmt: skip
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(file_name)
        except RankSkipped as skip:
            result.addSkip(self, skip.reason)
        except RankFailure:
            result.addFailure(self, sys.exc_info())
        except Exception:  # noqa: BLE001 - the harness's own error: reported as an error
            result.addError(self, sys.exc_info())
        else:
            result.addSuccess(self)
        finally:
            result.stopTest(self)
        return result

    def _timeout_error(self) -> str:
        """Why ``timeout`` is no deadline, naming the attribute ("" if it is one, or None: the
        default, ``--dist-timeout`` under pytest, else 60 s)."""
        if self.timeout is None:
            return ""
        why = seconds_error(self.timeout)
        return f"{type(self).__name__}.timeout: {why}" if why else ""


def _report_in_one_line(case: unittest.TestCase, result: Any, message: str) -> None:
    """``message`` as the test's error, without a traceback. pytest's own report (its
    unittest item is the result) takes no exception without frames: there, its one-line
    failure (``pytest.fail``, a BaseException that passes ``run``'s handlers). Any other
    result, a runner's or one a suite made for itself, gets a ValueError without frames,
    which unittest prints as that one line."""
    pytest_item = getattr(sys.modules.get("_pytest.unittest"), "TestCaseFunction", ())
    if isinstance(result, pytest_item):  # (a plugin's subclass of it too)
        import pytest

        pytest.fail(message, pytrace=False)
    result.addError(case, (ValueError, ValueError(message), None))


def pool_backend(backend: str) -> str:
    """The pool backend a test class's ``backend`` names: ``"gloo"``, or the CPU's in a
    per-device string (``"cpu:gloo,cuda:nccl"``, DTensor's tests' on a GPU machine)."""
    for part in backend.split(","):
        device, _, name = part.rpartition(":")
        if device in ("", "cpu"):
            return name
    return backend


def run_case(case_class: type, method: str, file_name: str) -> None:
    """On a rank: run one test method with its setUp/tearDown; raise what it raised."""
    import torch.distributed as dist

    pool = _PoolGroup()
    dist.init_process_group, dist.destroy_process_group = pool.init, pool.destroy
    outcome = _Outcome()
    try:
        case = case_class(method)
        case._file_name = file_name
        case.run(outcome)
    finally:
        try:
            pool.restore()
        except BaseException as rejoin:  # the test's own failure first, the rejoin's beside it
            if outcome.raised is None:
                raise
            raise outcome.raised from rejoin  # (both in the report)
    if outcome.raised is not None:
        raise outcome.raised  # the assertion itself, with its traceback, for the report
    if outcome.skipped:
        raise unittest.SkipTest(outcome.skipped[0][1])


class _PoolGroup:
    """``init_process_group`` and ``destroy_process_group`` for one test on a pool's rank.

    The pool's backend joins the pool's group (already initialised), whatever the store or
    ``init_method`` named; destroying the default group leaves it for the next test. Another
    backend is started for real with the test's arguments: the pool's group is set aside first
    (destroyed: one default group at a time), and ``restore`` joins it again when the test
    ends (every rank of the pool runs the same test, so every rank rejoins).
    """

    def __init__(self) -> None:
        import torch.distributed as dist

        from refddp.testing import context
        from refddp.testing.checks import collectives

        self.dist, self.collectives, self.context = dist, collectives, context
        self.real_init, self.real_destroy = dist.init_process_group, dist.destroy_process_group
        self.backend, self.rank, self.world = (dist.get_backend(), dist.get_rank(),
                                               dist.get_world_size())  # fmt: skip
        self.set_aside = False

    def init(self, backend: Any = None, *args: Any, **kwargs: Any) -> None:
        backend = kwargs.pop("backend", backend)
        if backend is None or pool_backend(str(backend).lower()) == self.backend:
            if self.set_aside:  # the pool's backend again, after another: a group of the test's
                self.start(self.backend, *args, **kwargs)
                return
            rank, world = kwargs.get("rank", self.rank), kwargs.get("world_size", self.world)
            if (rank, world) != (self.rank, self.world):
                raise ValueError(f"init_process_group(rank={rank}, world_size={world}) on rank "
                                 f"{self.rank} of a {self.world}-rank pool")  # fmt: skip
            return
        if not self.set_aside:
            self.collectives.enable_fingerprint_check(None)  # its group goes with the pool's
            self.real_destroy()
            self.set_aside = True
        elif self.dist.is_initialized():  # (torch refuses a second default group)
            self.real_destroy()
        self.start(backend, *args, **kwargs)

    def start(self, backend: Any, *args: Any, **kwargs: Any) -> None:
        """The test's own default group, without torch's DETAIL wrapper (which the harness's
        fingerprint check replaces, and which fake and threaded groups cannot take: they keep
        no sequence numbers)."""
        dist = self.dist
        detail = dist.get_debug_level() == dist.DebugLevel.DETAIL
        if detail:
            dist.set_debug_level(dist.DebugLevel.INFO)
        try:
            self.real_init(backend, *args, **kwargs)
        finally:
            if detail:
                dist.set_debug_level(dist.DebugLevel.DETAIL)

    def destroy(self, pg: Any = None) -> None:
        if self.set_aside or (pg is not None and pg is not self.dist.group.WORLD):
            self.real_destroy(pg)

    def restore(self) -> None:
        """The real functions back; the pool's group joined again where it was set aside."""
        self.dist.init_process_group = self.real_init
        self.dist.destroy_process_group = self.real_destroy
        if not self.set_aside:
            return
        if self.dist.is_initialized():  # the test left its group up
            self.real_destroy()
        assert self.context._rejoin_pool_group is not None, "a pool's rank can rejoin"
        self.context._rejoin_pool_group()


class _Outcome(unittest.TestResult):
    """unittest's result, keeping the first exception the test raised (not only its text);
    PyTorch's skip exit codes count as skips."""

    def __init__(self) -> None:
        super().__init__()
        self.raised: BaseException | None = None

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's name
        reason = _torch_skip(err[1])
        if reason is not None:
            self.addSkip(test, reason)
            return
        super().addError(test, err)
        self.raised = self.raised or err[1]

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's name
        super().addFailure(test, err)
        self.raised = self.raised or err[1]

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802 - unittest's
        super().addSubTest(test, subtest, err)  # records a failed subtest itself, not through
        if err is not None:  # addFailure/addError
            self.raised = self.raised or err[1]


def _torch_skip(exc: BaseException) -> str | None:
    """The reason, where ``exc`` is a rank's exit with one of PyTorch's skip codes
    (``common_distributed.TEST_SKIPS``: ``skip_if_lt_x_gpu`` exits with them); else None."""
    # PyTorch's own test helpers: a suite that exits with these codes has imported them (as
    # in _torch_assert_equal, refddp never imports them itself).
    common_distributed = sys.modules.get("torch.testing._internal.common_distributed")
    if not isinstance(exc, SystemExit) or common_distributed is None:
        return None
    for skip in common_distributed.TEST_SKIPS.values():
        if exc.code == skip.exit_code:
            return str(skip.message)
    return None


def _torch_assert_equal() -> Any:
    """``common_utils.TestCase.assertEqual`` where the suite has imported PyTorch's test
    helpers (shipped in the wheel), else None. Never imported here: importing them changes
    torch's global flags for every later test on the warm rank."""
    common_utils = sys.modules.get("torch.testing._internal.common_utils")
    test_case = getattr(common_utils, "TestCase", None)
    return getattr(test_case, "assertEqual", None)


def _holds_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        return True
    if isinstance(value, Mapping):  # a state dict
        return any(_holds_tensor(v) for v in value.values())
    return isinstance(value, list | tuple) and any(_holds_tensor(v) for v in value)


def _assert_close(first: Any, second: Any, msg: Any, **kwargs: Any) -> None:
    import torch

    exact_dtype = kwargs.pop("exact_dtype", True)
    if type(first) is not type(second):  # a tensor against a number or a list
        first, second, exact_dtype = torch.as_tensor(first), torch.as_tensor(second), False
    torch.testing.assert_close(first, second, atol=kwargs.get("atol"), rtol=kwargs.get("rtol"),
                               equal_nan=True, check_dtype=exact_dtype, msg=msg)  # fmt: skip


def _new_file() -> str:
    handle, name = tempfile.mkstemp(prefix="refddp-case-")
    os.close(handle)
    return name


def _option(name: str, default: Any) -> Any:
    """A refddp pytest option of the running session, if the plugin runs in one."""
    plugin = sys.modules.get("refddp.testing.plugin")
    config = getattr(plugin, "session_config", None)
    return config.getoption(name) if config is not None else default
