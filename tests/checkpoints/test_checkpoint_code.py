"""A checkpoint is data: the CLI never imports a module that only a checkpoint's config names."""

import os

import pytest
import torch

from refddp.config.schema import TrainConfig
from refddp.workload.models import build_model
from tests.cli_runs import run, train_command

PLANTED = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("code ran")
print("planted module imported")

def net(config):
    from refddp.workload.models import MLP
    return MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
'''
SPEC = "planted_module:net"


@pytest.fixture
def crafted(tmp_path):
    """A checkpoint whose config names ``planted_module:net``, importable on PYTHONPATH."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "planted_module.py").write_text(PLANTED)
    config = TrainConfig(input_dim=8, hidden_size=16, val_size=37)
    state = {
        "model_state_dict": build_model(config).state_dict(),
        "optimizer_state_dict": {},
        "scaler_state_dict": {},
        "epoch": 0,
        "step": 0,
        "world_size": 1,
        "config": {**config.to_dict(), "model": SPEC},
        "metrics": {},
    }
    path = tmp_path / "untrusted.pth"
    torch.save(state, path)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    return path, code / "IMPORTED", env


@pytest.mark.parametrize("task", ["eval", "predict", "train"])
def test_an_import_named_only_by_a_checkpoint_is_refused(tmp_path, crafted, task):
    path, marker, env = crafted
    done = run(train_command(tmp_path / "run", "--task", task, "--resume", path), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: model: refused to import '{SPEC}': only the checkpoint names it; pass "
        f"--model {SPEC} (or set it in --config) or --trust-checkpoint-code to allow it"
    ]
    assert not marker.exists() and "planted module imported" not in done.stdout


@pytest.mark.parametrize("allow", [["--model", SPEC], ["--trust-checkpoint-code"]])
def test_the_user_can_name_or_trust_the_import(tmp_path, crafted, allow):
    path, marker, env = crafted
    done = run(train_command(tmp_path / "run", "--task", "eval", "--resume", path, *allow), env=env)
    assert done.returncode == 0, done.stderr
    assert marker.exists() and "eval: val_loss" in done.stderr


@pytest.mark.parametrize("field", ["loss", "metrics"])
def test_a_loss_or_metrics_import_named_only_by_a_checkpoint_is_refused(tmp_path, crafted, field):
    path, marker, env = crafted
    state = torch.load(path, weights_only=True)
    state["config"] = {**state["config"], "model": "mlp", field: SPEC}
    torch.save(state, path)
    done = run(train_command(tmp_path / "run", "--task", "eval", "--resume", path), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {field}: refused to import '{SPEC}': only the checkpoint names it; pass "
        f"--{field} {SPEC} (or set it in --config) or --trust-checkpoint-code to allow it"
    ]
    assert not marker.exists()
