"""The harness's collective fingerprint compares dtypes too (shapes, order and reduce ops are
proven in test_harness.py): a dtype mismatch is caught before gloo sees mismatched buffers."""

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure


def mismatched_dtypes():
    dtype = torch.float32 if dist.get_rank() == 0 else torch.float64
    dist.all_reduce(torch.ones(2, dtype=dtype))


def test_mismatched_dtypes_fail_naming_both_dtypes(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(mismatched_dtypes, timeout=60)
    report = str(info.value)
    assert "Detected mismatch between collectives" in report
    assert "all_reduce((2,):float32, SUM)" in report and "all_reduce((2,):float64, SUM)" in report
