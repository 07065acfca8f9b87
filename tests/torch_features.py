"""Skips for tests of features this torch is too old for (``refddp/config/torch_support.py``): the
compatibility job runs the same tests on the floor of the declared range, where FSDP2 is not."""

import pytest

from refddp.config.torch_support import fsdp2_refused, torch_version

needs_fsdp2 = pytest.mark.skipif(fsdp2_refused() is not None, reason=str(fsdp2_refused()))
FSDP = pytest.param("fsdp", marks=needs_fsdp2)  # a strategy parameter that needs FSDP2

# PyTorch's own test helpers (torch.testing._internal) change from release to release; the
# unmodified PyTorch-style files of tests/harness/test_torch_suites.py are written against 2.13's.
# On 2.5, DTensorTestBase has no device_type, and plain pytest collects MultiProcessTestCase
# itself (it has no runTest there).
needs_torch_213_test_helpers = pytest.mark.skipif(
    torch_version() < (2, 13),
    reason="PyTorch's test helpers before torch 2.13 differ from those these files use",
)
