"""``FlagCarrier``, what DDP wraps under refddp's DDP strategy: the user's model and the
parameter whose gradient carries the step flags (``refddp/parallel.py``). Its dtype is the
trainable parameters' (one bucket with their gradients) unless half precision; the model's own
DDP ignore list keeps naming the same parameters; unwrapping reaches the model."""

import torch
from torch import nn

from refddp.parallel import FlagCarrier
from refddp.run_state import unwrap
from refddp.step_flags import FLAG_COUNT


def _carrier(model: nn.Module) -> FlagCarrier:
    return FlagCarrier(model, torch.device("cpu"))


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
