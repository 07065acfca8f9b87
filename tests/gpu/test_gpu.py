"""The GPU path: NCCL through the harness, the trainer on CUDA, AMP, compile, cross-device
checkpoints. Every test is marked `gpu` and skips, naming the GPUs needed and found, where
there are too few."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from refddp.testing.gpus import gpu_skip_reason
from tests.cli_runs import REPO
from tests.rank_tasks import nccl_gradients, nccl_rank_sum

pytestmark = pytest.mark.gpu

TINY = [
    "--train-size",
    "2048",
    "--val-size",
    "512",
    "--batch-size",
    "64",
    "--epochs",
    "2",
    "--no-progress",
]


def needs_gpus(n):
    reason = gpu_skip_reason(n)
    if reason:
        pytest.skip(reason)


def train(out, *args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "refddp.train", "--out", str(out), *TINY, *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def latest(out):
    return torch.load(Path(out) / "checkpoints" / "checkpoint_latest.pth", weights_only=True)


@pytest.mark.world_size(1, 2)
def test_spawn_runs_nccl_collectives_one_gpu_per_rank(spawn, _refddp_world_size):
    n = _refddp_world_size
    assert spawn(nccl_rank_sum) == [n * (n + 1) / 2] * n


@pytest.mark.multiproc
@pytest.mark.world_size(2)
def test_rank_side_test_gets_its_own_gpu(dist_ctx):
    assert dist_ctx.backend == "nccl" == dist.get_backend()
    assert dist_ctx.device == f"cuda:{dist_ctx.rank}"
    assert torch.cuda.current_device() == dist_ctx.rank


@pytest.mark.world_size(2)
def test_gradients_are_identical_across_gpus(spawn):
    grads = spawn(nccl_gradients)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_trainer_on_one_gpu_learns_with_each_precision(tmp_path, amp):
    needs_gpus(1)
    run = train(tmp_path, "--device", "cuda", "--nproc", 1, "--amp", amp)
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert history[-1]["val_acc"] > 0.8
    assert history[-1]["peak_memory_mb"] > 0 and "mfu" in history[-1]
    assert "done:" in run.stderr


@pytest.mark.parametrize("nproc", [2, 4])
def test_ddp_on_several_gpus_with_accumulation(tmp_path, nproc):
    needs_gpus(nproc)
    train(tmp_path, "--device", "cuda", "--nproc", nproc, "--amp", "bf16", "--grad-accum", 2)
    assert latest(tmp_path)["world_size"] == nproc


def test_gpu_checkpoint_loads_on_cpu_and_resumes_there(tmp_path):
    needs_gpus(1)
    train(tmp_path, "--device", "cuda", "--nproc", 1, "--epochs", 1)
    state = latest(tmp_path)
    assert all(v.device.type == "cpu" for v in state["model_state_dict"].values())
    train(tmp_path, "--device", "cpu", "--nproc", 1, "--epochs", 2)
    assert latest(tmp_path)["epoch"] == 2


def test_cpu_checkpoint_resumes_on_gpu(tmp_path):
    needs_gpus(1)
    train(tmp_path, "--device", "cpu", "--nproc", 1, "--epochs", 1)
    train(tmp_path, "--device", "cuda", "--nproc", 1, "--epochs", 2)
    assert latest(tmp_path)["epoch"] == 2


def test_resume_on_gpu_is_bit_identical(tmp_path):
    needs_gpus(1)
    flags = ["--device", "cuda", "--nproc", 1, "--deterministic", "--ckpt-every", 5]
    train(tmp_path / "straight", *flags)
    train(tmp_path / "stopped", *flags, "--stop-after", 7)
    train(tmp_path / "stopped", *flags)
    a, b = latest(tmp_path / "straight"), latest(tmp_path / "stopped")
    for key in a["model_state_dict"]:
        assert torch.equal(a["model_state_dict"][key], b["model_state_dict"][key]), key


def test_torch_compile_trains(tmp_path):
    needs_gpus(1)
    train(tmp_path, "--device", "cuda", "--nproc", 1, "--compile")
    assert not any(k.startswith("_orig_mod") for k in latest(tmp_path)["model_state_dict"])


def test_more_ranks_than_gpus_is_a_clear_error(tmp_path):
    needs_gpus(1)
    too_many = torch.cuda.device_count() + 1
    proc = train(tmp_path, "--device", "cuda", "--nproc", too_many, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: nproc: {too_many} ranks need {too_many} GPUs with "
        f"NCCL, found {torch.cuda.device_count()}"
    )


def test_nccl_flight_recorder_is_wired_for_the_trainer(tmp_path):
    needs_gpus(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NCCL")}
    code = (
        "import os, torch; from refddp.dist import init_distributed; "
        f"init_distributed('cuda', trace_dir={str(tmp_path)!r}); "
        "print(os.environ['TORCH_NCCL_DUMP_ON_TIMEOUT'], os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["1", str(tmp_path / "nccl_trace_rank_")], out.stderr
