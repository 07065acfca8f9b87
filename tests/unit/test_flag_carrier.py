"""``FlagCarrier``, what DDP wraps under refddp's DDP strategy: the user's model and the
parameter whose gradient carries the step flags (``refddp/parallel.py``). Its dtype is the
trainable parameters' (one bucket with their gradients) unless half precision or a world size
at which float32 would not bring the counts back exactly through DDP's averaging; the model's
own DDP ignore list keeps naming the same parameters; unwrapping reaches the model; a model
with nothing to train is refused as DDP refuses it."""

import pytest
import torch
from torch import nn

from refddp.parallel import FlagCarrier, carrier_dtype
from refddp.run_state import unwrap
from refddp.step_flags import COUNT_PART, FLAG_COUNT


def _carrier(model: nn.Module, world_size: int = 2) -> FlagCarrier:
    return FlagCarrier(model, torch.device("cpu"), world_size)


def test_the_carrier_takes_the_trainable_parameters_dtype_or_float32_for_half_precision():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1).double())
    model[0].requires_grad_(False)  # frozen float32 first: not in any bucket
    assert _carrier(model).flags.dtype == torch.float64
    assert _carrier(nn.Linear(2, 1).bfloat16()).flags.dtype == torch.float32  # 24-bit parts
    assert _carrier(nn.Linear(2, 1)).flags.shape == (FLAG_COUNT,)


def test_the_models_ddp_ignore_list_names_the_same_parameters_through_the_carrier():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model._ddp_params_and_buffers_to_ignore = ["1.weight"]  # as DDP's setter leaves it
    carrier = _carrier(model)
    assert carrier._ddp_params_and_buffers_to_ignore == ["model.1.weight"]
    assert dict(carrier.named_parameters())["model.1.weight"] is model[1].weight
    assert unwrap(carrier) is model


def test_a_model_with_nothing_to_train_is_refused_as_ddp_refuses_it():
    frozen = nn.Linear(2, 1).requires_grad_(False)
    with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a gradient"):
        _carrier(frozen)
    ignored = nn.Linear(2, 1)
    ignored._ddp_params_and_buffers_to_ignore = ["weight", "bias"]
    with pytest.raises(RuntimeError, match="requires a gradient"):
        _carrier(ignored)


def _averaged_the_ddp_way(parts: torch.Tensor, dtype: torch.dtype, scale: str) -> torch.Tensor:
    """What a rank reads back of per-rank count parts (rows: trials, columns: ranks) after
    DDP's averaging all-reduce and refddp's multiplication by the world size: each rank's
    value scaled by 1 / world size in ``dtype`` (``scale``: DDP divides a gradient that is its
    bucket's view in place, and multiplies one it copies into the bucket by the reciprocal, a
    double scalar; torch 2.13 copies the carrier's), summed one rank at a time (a ring's
    order), times the world size."""
    world = parts.shape[1]
    if scale == "divide":
        shares = parts.to(dtype) / world
    else:
        shares = parts.to(dtype) * torch.tensor(1 / world, dtype=torch.float64)
    total = torch.zeros(parts.shape[0], dtype=dtype)
    for rank in range(world):
        total += shares[:, rank]
    return total * world


SCALES = ["divide", "reciprocal"]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("world", [2, 3, 5, 7, 12, 24, 40, 43, 44, 64, 1024, 4096])
def test_float32_where_chosen_brings_every_count_part_back_exactly(world, scale):
    assert carrier_dtype(nn.Linear(2, 1), world) == torch.float32
    generator = torch.Generator().manual_seed(world)
    parts = torch.randint(0, COUNT_PART, (400, world), generator=generator)
    parts[0] = COUNT_PART - 1  # the largest part on every rank: the largest sum
    parts[1, :-1] = 0  # one rank's part alone
    expected = parts.sum(1).double()
    back = _averaged_the_ddp_way(parts, torch.float32, scale).double().round()
    assert torch.equal(back, expected)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("world", [45, 96, 384, 768, 3000, 6000])
def test_past_float32s_exact_world_sizes_the_carrier_is_float64_and_exact(world, scale):
    assert carrier_dtype(nn.Linear(2, 1), world) == torch.float64
    assert carrier_dtype(nn.Linear(2, 1).bfloat16(), world) == torch.float64
    generator = torch.Generator().manual_seed(world)
    parts = torch.randint(0, COUNT_PART, (200, world), generator=generator)
    parts[0] = COUNT_PART - 1
    expected = parts.sum(1).double()
    assert torch.equal(_averaged_the_ddp_way(parts, torch.float64, scale).round(), expected)


@pytest.mark.parametrize("scale", SCALES)
def test_float32_would_lose_counts_at_the_world_sizes_given_float64(scale):
    """Why the rule exists: at 768 ranks float32 averaging misses counts by several."""
    parts = torch.randint(0, COUNT_PART, (200, 768), generator=torch.Generator().manual_seed(0))
    back = _averaged_the_ddp_way(parts, torch.float32, scale).double().round()
    assert not torch.equal(back, parts.sum(1).double())
