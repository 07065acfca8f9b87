"""``StepFlags.local``: the non-finite flag is about the loss, not about a float32 copy of it."""

import torch

from refddp.step_flags import StepFlags, StopRequest


def test_a_large_finite_float64_loss_is_not_flagged_non_finite():
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False)
    large = torch.tensor(1e300, dtype=torch.float64)  # inf once cast to float32
    assert flags.local(large).tolist() == [0.0, 0.0, 0.0]
    assert torch.isnan(flags.local(torch.tensor(float("inf")))[0])
