"""Built-in models and user models by import path."""

import pytest
import torch

from refddp.config.schema import ConfigError, TrainConfig
from refddp.training.sync_batchnorm import GlobalBatchNorm, convert_sync_batchnorm
from refddp.workload.models import build_model


def test_built_in_models_map_inputs_to_class_logits():
    for name in ("mlp", "cnn", "convnet"):
        model = build_model(TrainConfig(model=name, input_dim=12, num_classes=5))
        assert model(torch.randn(3, 12)).shape == (3, 5)


def test_initialisation_is_a_function_of_the_seed():
    a = build_model(TrainConfig(seed=1)).state_dict()
    b = build_model(TrainConfig(seed=1)).state_dict()
    c = build_model(TrainConfig(seed=2)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_dtype_follows_the_config():
    model = build_model(TrainConfig(dtype="float64"))
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_user_model_by_import_path():
    model = build_model(
        TrainConfig(model="tests.user_code:tiny_linear", input_dim=6, num_classes=3)
    )
    assert isinstance(model, torch.nn.Linear) and model.in_features == 6


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_pkg:make", r"^model: cannot import module 'no_such_pkg'"),
        ("tests.user_code:missing", r"^model: module 'tests.user_code' has no attribute 'missing'"),
        ("tests.user_code:not_a_module", r"^model: 'tests.user_code:not_a_module' returned dict"),
        ("resnet", r"^model: 'resnet' is not one of mlp, cnn, convnet or package.module:callable"),
    ],
)
def test_bad_model_names_are_one_line_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        build_model(TrainConfig(model=spec))


def test_sync_bn_conversion_keeps_the_state_dict_dtype_and_single_process_numbers():
    # Checkpoints of a --sync-bn run must load into the plain model, in float64 without a
    # float32 round trip; on one process the converted model computes what BatchNorm does.
    c = TrainConfig(model="convnet", dropout=0.0, input_dim=8, hidden_size=16, dtype="float64")
    plain, synced = build_model(c), convert_sync_batchnorm(build_model(c))
    assert any(isinstance(m, GlobalBatchNorm) for m in synced.modules())
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in synced.modules())
    a, b = plain.state_dict(), synced.state_dict()
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(6, 8, dtype=torch.float64)
    assert torch.equal(synced(x), plain(x))
    assert all(torch.equal(plain.state_dict()[k], synced.state_dict()[k]) for k in a)
