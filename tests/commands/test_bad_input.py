"""Bad input: exit code 2, one line naming the field or file, no traceback, no rank started."""

import subprocess
import sys

import pytest
import torch

from refddp.checkpoints.full import LATEST
from refddp.checkpoints.run_state import FORMAT_VERSION
from refddp.config.schema import TrainConfig
from refddp.train import main
from refddp.workload.models import build_model
from tests.cli_runs import REPO


def expect_usage_error(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and expected in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--batch-size", "0"], "batch_size: must be >= 1, got 0"),
        (["--lr", "-0.1"], "lr: must be > 0, got -0.1"),
        # fp16's scale starts at 65536: a floor at or above it stops at the first overflow
        (["--min-loss-scale", "1e40"], "min_loss_scale: must be in (0, 65536), got 1e+40"),
        (
            ["--amp", "fp8"],
            "argument --amp: invalid choice: 'fp8' (choose from 'off', 'fp16', 'bf16')",
        ),
        (["--model", "no_such_pkg.models:net"], "model: cannot import module 'no_such_pkg.models'"),
        (["--data", "missing.pt"], "data: file not found: missing.pt"),
        (
            ["--global-batch-size", "10", "--nproc", "3"],
            "global_batch_size: 10 does not divide by world size 3 x grad_accum 1 = 3",
        ),
        (
            ["--train-size", "1", "--batch-size", "1", "--nproc", "2"],
            "data: 1 training samples for 2 rank(s) do not fill one global batch of 2",
        ),
        pytest.param(
            ["--device", "cuda"],
            "device: cuda requested but CUDA is not available here",
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="needs a machine without CUDA"
            ),
            id="cuda-without-gpu",
        ),
    ],
)
def test_bad_flags(capsys, tmp_path, argv, expected):
    expect_usage_error(capsys, [*argv, "--out", str(tmp_path / "run")], expected)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_yaml_typo_names_the_key_and_the_file(capsys, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("lerning_rate: 0.1\n")
    expect_usage_error(capsys, ["--config", str(config)], f"{config}: unknown key 'lerning_rate'")


def test_data_file_with_wrong_shapes(capsys, tmp_path):
    path = tmp_path / "d.pt"
    torch.save({"x": torch.randn(20, 3), "y": torch.zeros(20, dtype=torch.int64)}, path)
    expect_usage_error(
        capsys,
        ["--data", str(path), "--out", str(tmp_path)],
        f"data: x in {path} must be a float tensor of shape (N, input_dim=32), got float32 (20, 3)",
    )


def test_resume_path_that_does_not_exist(capsys, tmp_path):
    expect_usage_error(
        capsys,
        ["--resume", str(tmp_path / "gone.pth")],
        f"resume: checkpoint not found: {tmp_path}/gone.pth",
    )


def test_checkpoint_of_a_different_model_names_the_keys(capsys, tmp_path):
    cnn = TrainConfig(model="cnn")
    state = {
        "model_state_dict": build_model(cnn).state_dict(),
        "optimizer_state_dict": {},
        "scaler_state_dict": {},
        "epoch": 0,
        "step": 0,
        "world_size": 1,
        "config": {**cnn.to_dict(), "model": "mlp"},
        "metrics": {},
    }
    path = tmp_path / "cnn.pth"
    torch.save(state, path)
    expect_usage_error(
        capsys,
        ["--resume", str(path), "--out", str(tmp_path / "r")],
        "does not fit this model; missing keys: net.0.weight",
    )


def test_eval_without_a_checkpoint(capsys, tmp_path):
    expect_usage_error(
        capsys,
        ["--task", "eval", "--out", str(tmp_path)],
        "--task eval needs --resume PATH or a trained --out",
    )


def test_predict_with_resume_never_says_resume_rules_the_checkpoint_out(capsys, tmp_path):
    expect_usage_error(
        capsys,
        ["--task", "predict", "--resume", "never", "--out", str(tmp_path)],
        "--task predict needs a checkpoint, which resume: never rules out",
    )


def test_a_config_file_given_twice_is_refused_in_one_line(capsys, tmp_path):
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("epochs: 1\n")
    expect_usage_error(
        capsys,
        ["--config", str(tmp_path / "a.yaml"), "--config", str(tmp_path / "b.yaml"),
         "--out", str(tmp_path / "run")],
        "--config is given 2 times; give one file",
    )


def test_corrupt_latest_checkpoint_without_fallback(capsys, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / LATEST).write_bytes(b"PK\x03\x04 truncated")
    expect_usage_error(
        capsys, ["--out", str(tmp_path)], "checkpoint_latest.pth: corrupt or truncated checkpoint"
    )


def test_unwritable_run_directory(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    expect_usage_error(
        capsys,
        ["--out", str(blocker / "run")],
        f"out: cannot write to run directory {blocker}/run: Not a directory",
    )


def test_more_ranks_than_gpus_with_nccl(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    expect_usage_error(
        capsys,
        ["--device", "cuda", "--nproc", "2", "--out", str(tmp_path)],
        "nproc: 2 ranks need 2 GPUs with NCCL, found 1",
    )


def test_the_real_cli_exits_2_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "refddp.train", "--amp", "fp8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: argument --amp: invalid choice: 'fp8' (choose from 'off', 'fp16', 'bf16')"
    ]


def test_an_empty_validation_set_is_refused_before_training(capsys, tmp_path):
    path = tmp_path / "d.pt"
    torch.save(
        {
            "train_x": torch.randn(256, 32),
            "train_y": torch.zeros(256, dtype=torch.int64),
            "val_x": torch.empty(0, 32),
            "val_y": torch.empty(0, dtype=torch.int64),
        },
        path,
    )
    expect_usage_error(
        capsys,
        ["--data", str(path), "--out", str(tmp_path / "run")],
        f"data: the validation set of {path} is empty; it needs >= 1 sample",
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("text", ["fast", "1e-3x", "nan"])
def test_a_yaml_number_that_is_not_a_number_names_the_field(capsys, tmp_path, text):
    config = tmp_path / "train.yaml"
    config.write_text(f"lr: {text}\n")
    expect_usage_error(capsys, ["--config", str(config)], f"lr: expected float, got '{text}'")


def test_a_checkpoint_of_a_newer_format_is_refused_naming_both_versions(capsys, tmp_path):
    config = TrainConfig()
    state = {
        "format_version": FORMAT_VERSION + 1,
        "model_state_dict": build_model(config).state_dict(),
        "optimizer_state_dict": {},
        "scaler_state_dict": {},
        "epoch": 0,
        "step": 0,
        "world_size": 1,
        "config": config.to_dict(),
        "metrics": {},
    }
    path = tmp_path / "future.pth"
    torch.save(state, path)
    expect_usage_error(
        capsys,
        ["--task", "eval", "--resume", str(path), "--out", str(tmp_path / "r")],
        f"{path}: checkpoint format_version {FORMAT_VERSION + 1} is newer than this refddp "
        f"reads (format_version {FORMAT_VERSION})",
    )
