"""PyTorch's own ``MultiProcessTestCase`` suites, unmodified, on the harness's warm pools.

``pytest --dist-torch-suites test_c10d_gloo.py`` (or ``use_warm_pools()`` in a conftest)
puts ``PooledTestCase`` where ``torch.testing._internal.common_distributed`` has its
``MultiProcessTestCase``, before any test module is imported, in pytest's process and in each
rank (``DistributedTestCase.rank_setup``): every class built on it, in the test files and in
torch's own bases (``DTensorTestBase``, ``FSDPTest``, ``MultiProcContinuousTest`` is not),
then runs each test on a warm pool of ``world_size`` ranks instead of spawning processes for
it, with ``MultiProcessTestCase``'s API (``self.rank``, ``self.world_size``,
``self.file_name``, ``_spawn_processes``, ``init_process_group`` on ``file://`` or a
``FileStore``) and ``common_utils.TestCase``'s helpers (the tensor-aware ``assertEqual``...).

Importing PyTorch's test helpers changes torch's global flags (``common_utils`` sets them at
import): this is why it is an option, for the sessions that run such suites.
"""

from __future__ import annotations

from typing import Any

from refddp.testing.driver.unittest_case import DistributedTestCase

SWAP = "refddp.testing.torch_suites:use_warm_pools"
DEFAULT_WORLD_SIZE = 4  # MultiProcessTestCase's


def use_warm_pools() -> None:
    """Put ``PooledTestCase`` in place of ``MultiProcessTestCase`` (idempotent). Modules that
    import it afterwards build their classes on it; one imported before keeps the original,
    hence pytest's ``--dist-torch-suites`` calls this before collection."""
    from torch.testing._internal import common_distributed

    if common_distributed.MultiProcessTestCase is not pooled_test_case():
        common_distributed.MultiProcessTestCase = pooled_test_case()


_pooled: type | None = None


def pooled_test_case() -> type:
    """``PooledTestCase``, made once: a ``DistributedTestCase`` with ``common_utils.TestCase``'s
    helpers and ``MultiProcessTestCase``'s class attributes."""
    global _pooled
    if _pooled is not None:
        return _pooled
    from torch.testing._internal import common_distributed, common_utils

    original = common_distributed.MultiProcessTestCase

    class PooledTestCase(DistributedTestCase, common_utils.TestCase):
        """Runs each test method on every rank of a warm pool; see the module's docstring."""

        MAIN_PROCESS_RANK = original.MAIN_PROCESS_RANK
        TEST_ERROR_EXIT_CODE = original.TEST_ERROR_EXIT_CODE
        rank_setup = (SWAP,)

        @property
        def world_size(self) -> int:
            return DEFAULT_WORLD_SIZE

        @property
        def destroy_pg_upon_exit(self) -> bool:
            return True

        def _should_stop_test_suite(self) -> bool:
            return False  # as MultiProcessTestCase: one failure does not end the suite

        def _current_test_name(self) -> str:
            return self.id().split(".")[-1]

        def _start_processes(self, proc: Any) -> None:
            """MultiProcessTestCase's start of its processes: the pool's ranks already run."""

    PooledTestCase.__module__ = __name__
    PooledTestCase.__qualname__ = "PooledTestCase"
    _pooled = PooledTestCase
    return PooledTestCase


def __getattr__(name: str) -> Any:
    """``PooledTestCase`` as a module attribute, so that pickle finds it by name (a rank
    imports this module and makes the class there too)."""
    if name == "PooledTestCase":
        return pooled_test_case()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
