"""``examples/imagefolder_resnet.yaml``: torchvision's ResNet-18 trained by the CLI from a
folder of real PNG files, as the README says; its checkpoint is a bare ResNet-18's weights.

Runs where torchvision imports beside this torch (the compatibility job's torch 2.14.1 +
torchvision 0.29.1; ``make compat TORCH=2.14.1 TORCHVISION=0.29.1``).
"""

import pytest
import torch
import torch.nn.functional as F

from examples.make_image_folder import write
from tests.checkpoints.test_resume import assert_same_weights
from tests.training.test_skipped_steps import history as evaluations_and_skips
from tests.workload.test_image_folder import needs_torchvision

pytestmark = needs_torchvision
# 24 px, not 16: ResNet-18's layer4 then sees 2x2 maps. At 16 px its first 3x3 stride-2 conv
# sees a 1x1 map, whose bf16 weight gradient oneDNN (torch 2.13, 2.14) leaves NaN now and then
# on CPUs with AVX512-BF16 and AMX; every step of CI's run on such a CPU was skipped
# (docs/known-limitations.md).
SMALL = dict(image_size=24, batch_size=8, num_workers=2, device="cpu", warmup_steps=2)


@pytest.fixture
def shapes(tmp_path):
    write(str(tmp_path / "shapes"), per_class=24, size=24)  # 80 train, 16 val PNGs
    return tmp_path / "shapes"


def test_the_resnet_example_trains_from_pngs_and_its_checkpoint_loads_into_a_bare_resnet18(
    run_cli, shapes
):
    import torchvision

    from refddp.checkpoints.run_state import clean_state_dict
    from refddp.workload.data import build_datasets

    # A hang guard, not a time goal: 2 ranks of bf16 ResNet-18 on the CPU, 2 loader workers
    # each, beside the other test's runs on 2 cores took 237-240 s at 16 px on 2026-11-28 (the
    # default 240 s deadline failed CI's 2.14.1 job once at 240 s, every process still
    # working); at 24 px, this file's two tests alone took 120 s on 2026-11-29.
    done = run_cli("--config", "examples/imagefolder_resnet.yaml", "--nproc", 2, data=shapes,
                   epochs=3, eval_every=5, timeout=600, **SMALL)  # fmt: skip
    history, skips = evaluations_and_skips(done.out)
    assert [r["step"] for r in history] == [5, 10, 15], (history, skips)
    assert skips == [], "no non-finite step at 24 px"
    assert all(0 <= r["val_acc"] <= 1 for r in history)
    checkpoints = sorted(p.name for p in (done.out / "checkpoints").iterdir())
    assert {"checkpoint_best.pth", "checkpoint_latest.pth"} <= set(checkpoints), checkpoints
    # The bare model, in this process: it evaluates to the validation loss the run recorded.
    model = torchvision.models.resnet18(num_classes=4)
    model.load_state_dict(clean_state_dict(done.weights()))
    model.eval()
    _, val = build_datasets(done.checkpoint()["config"])
    images = torch.stack([val[i][0] for i in range(len(val))])
    labels = torch.tensor([val[i][1] for i in range(len(val))])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # as the run evaluated
        loss = F.cross_entropy(model(images).float(), labels)
    assert float(loss) == pytest.approx(history[-1]["val_loss"], rel=0.02)


def test_a_run_on_images_stopped_mid_epoch_resumes_exactly(run_cli, shapes):
    flags = dict(config="examples/imagefolder_resnet.yaml", data=shapes, epochs=2, amp="off",
                 deterministic=True, **SMALL)  # fmt: skip
    straight = run_cli("--nproc", 2, out="straight", **flags)
    run_cli("--nproc", 2, "--stop-after", 7, out="resumed", **flags)  # 5 steps an epoch
    resumed = run_cli("--nproc", 2, out="resumed", **flags)
    assert_same_weights(straight.weights(), resumed.weights())
