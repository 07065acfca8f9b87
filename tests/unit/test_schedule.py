"""The learning-rate schedule: linear warm-up, then cosine to zero or constant."""

import math

import pytest

from refddp.config import TrainConfig
from refddp.trainer import lr_factor


def test_warmup_is_linear_then_cosine_reaches_zero_at_the_last_step():
    f = lr_factor(TrainConfig(warmup_steps=4, lr_schedule="cosine"), total_steps=14)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0
    assert f(9) == pytest.approx(0.5)
    assert f(14) == pytest.approx(0.0, abs=1e-12)
    assert all(f(s) >= f(s + 1) for s in range(4, 14)), "cosine never rises"


def test_constant_schedule_stays_at_the_peak_after_warmup():
    f = lr_factor(TrainConfig(warmup_steps=2, lr_schedule="constant"), total_steps=10)
    assert [f(s) for s in range(5)] == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_cosine_without_warmup_starts_at_the_peak():
    f = lr_factor(TrainConfig(lr_schedule="cosine"), total_steps=10)
    assert f(0) == 1.0 and f(5) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
