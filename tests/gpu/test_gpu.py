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

import refddp
from refddp.checkpoints import dcp as checkpoint_dcp
from refddp.testing.driver.gpus import gpu_skip_reason
from tests.cli_runs import REPO
from tests.rank_tasks import (
    fit_on_gpu_counting_host_syncs,
    nccl_gradients,
    nccl_rank_sum,
)
from tests.sequence_code import TOKEN_RUN

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
        "import os, torch; from refddp.launch.dist import init_distributed; "
        f"init_distributed('cuda', trace_dir={str(tmp_path)!r}); "
        "print(os.environ['TORCH_NCCL_DUMP_ON_TIMEOUT'], os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["1", str(tmp_path / "nccl_trace_rank_")], out.stderr


# -- FSDP (--strategy fsdp) on GPUs: NCCL, bf16, both checkpoint formats ----------------------


def weights_of(out):
    """The model of the latest checkpoint, full format or dcp (read whole, on the CPU)."""
    dcp_latest = Path(out) / "checkpoints" / checkpoint_dcp.LATEST
    if dcp_latest.exists():
        state = checkpoint_dcp.load_full(checkpoint_dcp.load_run_state(str(dcp_latest)))
        return state["model_state_dict"]
    return latest(out)["model_state_dict"]


def test_fsdp_with_bf16_on_two_gpus_learns_and_saves_a_checkpoint_a_bare_model_loads(tmp_path):
    needs_gpus(2)
    train(tmp_path, "--device", "cuda", "--nproc", 2, "--strategy", "fsdp", "--amp", "bf16")
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert history[-1]["val_acc"] > 0.8
    state = latest(tmp_path)
    assert state["world_size"] == 2
    assert all(v.device.type == "cpu" for v in state["model_state_dict"].values())
    refddp.build_model(state["config"]).load_state_dict(state["model_state_dict"])  # strict


@pytest.mark.parametrize("ckpt_format", ["full", "dcp"])
def test_fsdp_resume_on_gpus_is_bit_identical(tmp_path, ckpt_format):
    needs_gpus(2)
    flags = ["--device", "cuda", "--nproc", 2, "--strategy", "fsdp", "--deterministic",
             "--ckpt-every", 5, "--ckpt-format", ckpt_format]  # fmt: skip
    train(tmp_path / "straight", *flags)
    train(tmp_path / "stopped", *flags, "--stop-after", 7)
    train(tmp_path / "stopped", *flags)
    a, b = weights_of(tmp_path / "straight"), weights_of(tmp_path / "stopped")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fsdp_dcp_checkpoint_written_on_gpus_resumes_on_cpu(tmp_path):
    needs_gpus(2)
    flags = ["--nproc", 2, "--strategy", "fsdp", "--ckpt-format", "dcp"]
    train(tmp_path, "--device", "cuda", *flags, "--epochs", 1)
    train(tmp_path, "--device", "cpu", *flags, "--epochs", 2)
    assert len(weights_of(tmp_path)) > 0
    assert '"epoch": 2' in (tmp_path / "history.jsonl").read_text()


def test_fsdp_with_torch_compile_on_two_gpus(tmp_path):
    needs_gpus(2)
    train(tmp_path, "--device", "cuda", "--nproc", 2, "--strategy", "fsdp", "--compile")
    assert not any(k.startswith("_orig_mod") for k in latest(tmp_path)["model_state_dict"])


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("job", ["samples", "tokens-clipped"])
def test_a_training_step_on_gpus_syncs_with_the_host_once_and_steps_fused(
    spawn, _refddp_world_size, tmp_path, job
):
    # One host read a step: the gradient's norm, which decides whether the step is applied,
    # read in one copy with the step's agreement (target count, stop signals, the last loss).
    # Anything else that waited for the device (a tensor made from a float, a count copied
    # from the host, a loss read of its own) would add one. The optimizer runs torch's fused
    # kernel. "tokens-clipped": padded sequences (a count agreed before the backward), clipped.
    overrides = {} if job == "samples" else dict(TOKEN_RUN, grad_clip=1.0, epochs=3,
                                                 optimizer="adamw")  # fmt: skip
    for result in spawn(fit_on_gpu_counting_host_syncs, str(tmp_path), **overrides):
        assert result["syncs"] and set(result["syncs"]) == {1}, result["syncs"]
        assert result["fused"]


def test_the_profiler_writes_a_trace_with_gpu_kernels_and_a_memory_snapshot(tmp_path):
    needs_gpus(1)
    import pickle

    train(tmp_path, "--profile", "3:4", "--device", "cuda")
    with open(tmp_path / "profile" / "rank0.json") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events), "CUDA kernels in the trace"
    with open(tmp_path / "profile" / "rank0_memory.pickle", "rb") as f:  # our own run's file
        snapshot = pickle.load(f)
    assert snapshot["segments"] and snapshot["device_traces"], "allocator state and history"
    assert not list((tmp_path / "profile").glob("*.tmp-*")), "written atomically"
