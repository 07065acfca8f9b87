"""On CUDA the optimizer runs torch's fused kernel (one a step) where torch has one; on the CPU
torch's default. A checkpoint carries the kernel choice of the run that wrote it; a resumed
run keeps its own (a CPU checkpoint resumed on a GPU runs fused). The CPU cannot answer yes to
``fuses_on_cuda``: it is stood in for here (fused kernels exist on the CPU too)."""

import pytest

from tests.checkpoints.test_resume import assert_same_weights
from tests.rank_tasks import (
    fit_full_weights,
    fit_full_weights_where_cuda_fuses,
    optimizer_where_cuda_fuses,
)
from tests.torch_features import needs_fsdp2

ROUNDING = {"rtol": 1e-9, "atol": 1e-12}  # float64: fused and foreach kernels round apart


@pytest.mark.world_size(1)
@pytest.mark.parametrize("fuses", [True, False])
def test_the_trainer_fuses_its_optimizer_where_cuda_has_the_kernel(spawn, tmp_path, fuses):
    (result,) = spawn(optimizer_where_cuda_fuses, str(tmp_path), fuses)
    assert result["fused"] == [fuses], result


@pytest.mark.parametrize("strategy, ckpt_format", [("ddp", "full"), pytest.param("fsdp", "dcp", marks=needs_fsdp2)])
def test_a_run_resumes_with_this_invocations_optimizer_kernels(
    spawn, tmp_path, strategy, ckpt_format
):
    # load_state_dict would bring back the saved run's kernel choice (fused=None) with its
    # param groups: the resumed run would then not run the kernel it was built with.
    job = dict(strategy=strategy, ckpt_format=ckpt_format)
    straight = spawn(fit_full_weights, str(tmp_path / "straight"), **job)[0]
    out = str(tmp_path / "run")
    spawn(fit_full_weights, out, stop_after=5, **job)  # the CPU's kernels
    resumed = spawn(fit_full_weights_where_cuda_fuses, out, True, **job)[0]
    assert resumed["resumed_from"] and resumed["step"] == straight["step"]
    assert resumed["fused"], "the resumed optimizer runs this invocation's fused kernels"
    assert_same_weights(resumed["weights"], straight["weights"], **ROUNDING)
