"""The declared torch range and the one-line refusal of a feature this torch is too old for
(``refddp/config/torch_support.py``)."""

import pytest
import torch
import torch.distributed.fsdp

from refddp.config import torch_support
from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import validate


def test_the_version_is_read_as_major_and_minor(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.0+cu124")
    assert torch_support.torch_version() == (2, 5)
    assert torch_support.too_old("x", (2, 5)) is None
    assert torch_support.too_old("x", (2, 6)) == "x needs torch >= 2.6; this is torch 2.5.0+cu124"
    monkeypatch.setattr(torch, "__version__", "2.10.1")  # 2.10 is newer than 2.6, not older
    assert torch_support.too_old("x", (2, 6)) is None


def test_fsdp_on_a_torch_without_public_fully_shard_is_one_line_naming_the_version(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.0")
    monkeypatch.delattr(torch.distributed.fsdp, "fully_shard", raising=False)
    with pytest.raises(ConfigError) as info:
        validate(TrainConfig(strategy="fsdp"))
    assert str(info.value) == (
        "strategy fsdp (torch.distributed.fsdp.fully_shard) needs torch >= 2.6; this is torch "
        "2.5.0; use --strategy ddp"
    )
