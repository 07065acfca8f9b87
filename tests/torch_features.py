"""Skips for tests of features this torch is too old for (``refddp/torch_support.py``): the
compatibility job runs the same tests on the floor of the declared range, where FSDP2 is not."""

import pytest

from refddp.torch_support import fsdp2_refused

needs_fsdp2 = pytest.mark.skipif(fsdp2_refused() is not None, reason=str(fsdp2_refused()))
FSDP = pytest.param("fsdp", marks=needs_fsdp2)  # a strategy parameter that needs FSDP2
