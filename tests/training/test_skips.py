"""refddp/training/skips.py on its own: the buffers a skipped step puts back (those a forward assigns
anew included), and what GradScaler does after a skipped step (backs off for an fp16 overflow,
for nothing else)."""

import math

import pytest
import torch
from torch import nn

from refddp.training.skips import BufferSnapshot, end_scaler_iteration


class Ema(nn.Module):
    """A running mean kept by assigning a new tensor each forward, as EMA and VQ code does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.zeros(3))
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):
        self.ema = 0.9 * self.ema + 0.1 * x.mean(0)
        return self.norm(x)


def test_a_snapshot_puts_back_buffers_updated_in_place_and_assigned_anew():
    model = Ema().train()
    model(torch.randn(4, 3))  # some statistics to keep
    snapshot = BufferSnapshot(model)
    snapshot.take()
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.full((4, 3), math.inf))  # the skipped step's forward
    assert not torch.isfinite(model.ema).all() and not torch.isfinite(model.norm.running_mean).all()
    snapshot.restore()
    for key, value in model.state_dict().items():
        assert torch.equal(value, kept[key]), key
    # The next step's forward assigns again; the snapshot follows the buffer it now holds.
    model(torch.randn(4, 3))
    snapshot.take()
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.full((4, 3), math.nan))
    snapshot.restore()
    for key, value in model.state_dict().items():
        assert torch.equal(value, kept[key]), key


class Routed(nn.Module):
    """A mixture of experts' usage counts (int64, one per expert) and a step counter, which
    its forward updates in place, beside a large constant mask."""

    def __init__(self):
        super().__init__()
        self.register_buffer("expert_counts", torch.zeros(4, dtype=torch.int64))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mask", torch.ones(300, 300, dtype=torch.bool))  # 90,000 elements

    def forward(self, x):
        self.expert_counts += torch.bincount(x.argmax(1), minlength=4)
        self.calls += 1
        return x


def test_a_snapshot_puts_back_small_integer_buffers_and_leaves_large_constants_uncopied():
    # A 4-element counter was taken for a constant: a skipped step (and the warm-up backward
    # of 3 or more DDP ranks) left its counts in it.
    model = Routed()
    snapshot = BufferSnapshot(model)
    snapshot.take()
    model(torch.randn(8, 4))
    snapshot.restore()
    assert model.expert_counts.sum() == 0 and model.calls == 0
    assert set(name for _, name in snapshot.saved) == {"expert_counts", "calls"}, "mask uncopied"


def scaler_after_unscale(gradient: float) -> tuple[torch.amp.GradScaler, torch.optim.Optimizer]:
    """A GradScaler (initial scale 2**16, growth every 2 steps) one step in, whose unscale_
    has read a gradient of ``gradient`` (times the scale)."""
    weight = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=2)
    scaler.scale(weight.sum()).backward()  # a first, finite step: the growth count is 1
    scaler.step(optimizer)
    scaler.update()
    weight.grad = torch.full((4,), gradient) * scaler.get_scale()
    scaler.unscale_(optimizer)
    return scaler, optimizer


@pytest.mark.parametrize("bad_loss", [False, True])
def test_grad_scaler_backs_off_for_an_overflow_only(bad_loss):
    scaler, _ = scaler_after_unscale(math.inf)
    kept = scaler.state_dict()
    assert kept["_growth_tracker"] == 1
    overflow = end_scaler_iteration(scaler, bad_loss)
    if bad_loss:  # a non-finite loss: no overflow, the scale and growth count as they were
        assert overflow is None and scaler.state_dict() == kept
    else:
        assert overflow == (2.0**16, 2.0**15)
        assert scaler.state_dict()["_growth_tracker"] == 0


def test_finite_gradients_whose_norm_overflowed_change_nothing():
    # Each gradient is finite (2e19); their norm's square is past float32's range. GradScaler's
    # own check sees nothing: its update would count the step as a good one (here, growing the
    # scale), which a skipped step must not.
    scaler, optimizer = scaler_after_unscale(2e19)
    norm = torch.linalg.vector_norm(optimizer.param_groups[0]["params"][0].grad)
    assert not torch.isfinite(norm)
    kept = scaler.state_dict()
    assert end_scaler_iteration(scaler, bad_loss=False) is None
    assert scaler.state_dict() == kept
    scaler.unscale_(optimizer)  # the next step can unscale: the iteration was ended


def test_a_final_evaluation_fails_on_its_loss_not_on_a_metric_made_infinite():
    from refddp.training.evaluation import finite_validation

    assert not finite_validation({"val_loss": math.nan, "val_acc": 0.5})
    assert not finite_validation({"val_loss": math.inf})
    # A finite loss of 840 (logits scaled up) makes perplexity inf; a user metric may be inf.
    assert finite_validation({"val_loss": 839.77, "val_perplexity": math.inf, "val_ratio": math.inf})
    assert finite_validation({}), "no evaluation yet: nothing to fail on"
