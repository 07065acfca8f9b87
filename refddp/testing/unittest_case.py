"""``DistributedTestCase``: a home for ``unittest`` suites written for PyTorch's
``MultiProcessTestCase``.

Change the base class and the suite runs on the harness's warm pools: each test method (with
``setUp`` and ``tearDown``) runs on every rank of a ``world_size`` group, ``self.rank`` and
``self.world_size`` as there, failures reported by rank. What such suites do for themselves
keeps working: ``self._spawn_processes()`` in ``setUp`` is a no-op (the ranks exist);
``dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, ...)`` (any
``init_method`` or store, e.g. ``f"file://{self.file_name}"``) joins the pool's group, which is
already initialised, and ``dist.destroy_process_group()`` leaves it for the next test. Runs under
pytest (the plugin's ``--dist-timeout`` and ``--no-dist-debug`` apply) or ``python -m unittest``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import unittest
from typing import Any

DEFAULT_WORLD_SIZE = 4  # MultiProcessTestCase's


class DistributedTestCase(unittest.TestCase):
    """Run each test method on every rank of a process group (see the module's docstring)."""

    timeout: float | None = None  # seconds; None: --dist-timeout under pytest, else 60
    backend: str = "gloo"

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank()

    @property
    def file_name(self) -> str:
        """A file per test, as MultiProcessTestCase gives for ``file://`` rendezvous."""
        if not hasattr(self, "_file_name"):
            handle, self._file_name = tempfile.mkstemp(prefix="refddp-case-")
            os.close(handle)
        return self._file_name

    def _spawn_processes(self) -> None:
        """MultiProcessTestCase's set-up step: the pool's ranks already run."""

    def run(self, result: unittest.TestResult | None = None) -> Any:
        from refddp.testing.context import rank_context

        if rank_context() is not None:  # on a rank: the method itself
            return super().run(result)
        return self._run_on_ranks(result)

    def _run_on_ranks(self, result: unittest.TestResult | None) -> Any:
        from refddp.testing.context import RankFailure, RankSkipped
        from refddp.testing.warm_pools import DEFAULT_TIMEOUT_S, PoolKey, run_on_pool

        result = result if result is not None else self.defaultTestResult()
        result.startTest(self)
        try:
            key = PoolKey(self.world_size, self.backend, _option("dist_debug", True))
            deadline = self.timeout or _option("dist_timeout", DEFAULT_TIMEOUT_S)
            case = (type(self), self._testMethodName)
            run_on_pool(key, run_case, case, {}, deadline, extra_modules=(type(self).__module__,))
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


def run_case(case_class: type, method: str) -> None:
    """On a rank: run one test method with its setUp/tearDown; raise what unittest recorded."""
    import torch.distributed as dist

    group = (dist.get_backend(), dist.get_rank(), dist.get_world_size())
    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
        rank, world = kwargs.get("rank", group[1]), kwargs.get("world_size", group[2])
        if (rank, world) != group[1:]:
            raise ValueError(f"init_process_group(rank={rank}, world_size={world}) on rank "
                             f"{group[1]} of a {group[2]}-rank pool")  # fmt: skip

    def destroy_process_group(pg: Any = None) -> None:
        if pg is not None and pg is not dist.group.WORLD:
            real_destroy(pg)

    dist.init_process_group, dist.destroy_process_group = init_process_group, destroy_process_group
    try:
        outcome = unittest.TestResult()
        case_class(method).run(outcome)
    finally:
        dist.init_process_group, dist.destroy_process_group = real_init, real_destroy
    for _, text in outcome.errors + outcome.failures:
        raise AssertionError(text)
    if outcome.skipped:
        raise unittest.SkipTest(outcome.skipped[0][1])


def _option(name: str, default: Any) -> Any:
    """A refddp pytest option of the running session, if the plugin runs in one."""
    plugin = sys.modules.get("refddp.testing.plugin")
    config = getattr(plugin, "session_config", None)
    return config.getoption(name) if config is not None else default
