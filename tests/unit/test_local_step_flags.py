"""``StepFlags.local``: the non-finite flag is about the loss, not about a float32 copy of it;
the target count survives the float32 all-reduce exactly."""

import torch

from refddp.step_flags import StepFlags, StopRequest, _decode


def test_a_large_finite_float64_loss_is_not_flagged_non_finite():
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False)
    large = torch.tensor(1e300, dtype=torch.float64)  # inf once cast to float32
    assert flags.local(large)[0].item() == 0.0
    assert not _decode(flags.local(large).tolist()).nonfinite
    assert torch.isnan(flags.local(torch.tensor(float("inf")))[0])


def test_the_target_count_is_summed_over_ranks_exactly_beyond_float32_integers():
    flags = StepFlags(None, StopRequest(), torch.device("cpu"), late=False)
    big = 2**24 + 3  # float32 cannot hold it: a count sent as one float32 would round
    assert float(torch.tensor(big, dtype=torch.float32)) != big
    summed = flags.local(None, torch.tensor(big)) + flags.local(None, 5)  # an all-reduce's sum
    assert StepFlags.targets(summed).item() == big + 5
    assert _decode(summed.tolist()).targets == big + 5
