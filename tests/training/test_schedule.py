"""The learning-rate schedule: linear warm-up, then cosine to zero or constant, set on the
optimizer through torch's LambdaLR."""

import math

import pytest
import torch

from refddp.config.schema import TrainConfig
from refddp.training.schedule import Schedule, lr_factor


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


def _optimizer(lr: float) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    return torch.optim.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=lr)


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_the_schedule_sets_what_lambda_lr_would_at_every_step_and_saves_its_state(schedule):
    c = TrainConfig(lr=0.1, warmup_steps=3, lr_schedule=schedule)
    ours, theirs = _optimizer(0.1), _optimizer(0.1)
    mine = Schedule(ours, c, total_steps=12)
    torch_lr = torch.optim.lr_scheduler.LambdaLR(theirs, lr_factor(c, 12))
    for step in range(1, 13):
        assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in theirs.param_groups]
        theirs.step()
        torch_lr.step()
        mine.advance(step)
        assert mine.state_dict() == torch_lr.state_dict(), step
    assert [g["initial_lr"] for g in ours.param_groups] == [0.1, 0.1]


def test_a_resumed_schedule_takes_its_rate_from_the_step_and_this_invocations_lr():
    c = TrainConfig(lr=0.5, warmup_steps=10, lr_schedule="cosine")
    optimizer = _optimizer(0.5)
    schedule = Schedule(optimizer, c, total_steps=100)
    for group in optimizer.param_groups:  # what loading an older run's optimizer state did
        group["lr"] = group["initial_lr"] = 0.01
    schedule.reset(50)  # a resume sets it whatever the groups held
    assert [g["lr"] for g in optimizer.param_groups] == [schedule.rate(50)] * 2
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.5, 0.5]
    assert schedule.state_dict()["last_epoch"] == 50
    optimizer.step()
    schedule.advance(51)
    assert [g["lr"] for g in optimizer.param_groups] == [schedule.rate(51)] * 2


def test_a_step_the_schedule_did_not_expect_is_refused():
    schedule = Schedule(_optimizer(0.1), TrainConfig(lr=0.1), total_steps=10)
    with pytest.raises(RuntimeError, match="schedule at update 0, asked for 2"):
        schedule.advance(2)


def test_the_rate_reaches_the_optimizer_after_it_loads_a_saved_state():
    c = TrainConfig(lr=0.1, lr_schedule="cosine")
    optimizer = _optimizer(0.1)
    schedule = Schedule(optimizer, c, total_steps=10)
    optimizer.load_state_dict(_optimizer(0.7).state_dict())  # a resume: new param_groups
    for step in range(1, 6):
        schedule.advance(step)
    assert [g["lr"] for g in optimizer.param_groups] == [schedule.rate(5)] * 2
