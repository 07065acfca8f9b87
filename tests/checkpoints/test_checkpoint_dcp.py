"""``--ckpt-format dcp``: sharded checkpoints each rank writes itself, through the harness.

The same run state as the full format, resumed bit-identically at the same world size and
resharded at another one (and across strategies), written atomically, and converted to the
very file the full format writes (``python -m refddp.convert_checkpoint``).
"""

import math
import os

import pytest
import torch

from refddp import convert_checkpoint
from refddp.checkpoints import dcp as checkpoint_dcp
from refddp.checkpoints.full import LATEST
from tests.rank_tasks import fit_full_weights, fit_then_save_full, fit_with_a_failing_dcp_save
from tests.torch_features import FSDP, needs_fsdp2

CLOSE = {"rtol": 1e-9, "atol": 1e-12}  # float64: reduction order only


def assert_same(a, b, rtol=0.0, atol=0.0, where="", skip=()):
    """Equal, key by key (tensors exactly unless a tolerance is given), except paths in skip."""
    if where in skip:
        return
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], rtol, atol, f"{where}/{key}", skip)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, rtol, atol, f"{where}[{i}]", skip)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=where)
    elif not (isinstance(a, float) and math.isnan(a) and math.isnan(b)):
        assert a == b, where


def latest_dcp(out):
    return os.path.join(out, "checkpoints", checkpoint_dcp.LATEST)


@pytest.mark.parametrize("strategy", [FSDP, "ddp"])
def test_dcp_resume_mid_epoch_is_bit_identical(spawn, tmp_path, strategy):
    flags = dict(strategy=strategy, ckpt_every=2)
    straight = spawn(fit_full_weights, str(tmp_path / "a"), world_size=2, **flags)[0]
    out = tmp_path / "b"
    spawn(fit_full_weights, str(out), world_size=2, stop_after=7, ckpt_format="dcp", **flags)
    assert os.path.islink(latest_dcp(out)) and not (out / "checkpoints" / LATEST).exists()
    resumed = spawn(fit_full_weights, str(out), world_size=2, ckpt_format="dcp", **flags)[0]
    assert resumed["resumed_from"] == latest_dcp(out)  # not the same weights from scratch
    assert resumed["step"] == straight["step"] == 24
    assert_same(resumed["weights"], straight["weights"])  # bit for bit
    assert_same(resumed["optimizer"], straight["optimizer"])


@needs_fsdp2
def test_dcp_resume_reshards_across_world_sizes_and_strategies(spawn, tmp_path):
    flags = dict(global_batch_size=12, ckpt_format="dcp")  # 8 steps per epoch, 16 in all
    straight = spawn(fit_full_weights, str(tmp_path / "a"), world_size=2, strategy="fsdp",
                     **flags)[0]  # fmt: skip
    out = str(tmp_path / "b")
    for size, strategy in ((2, "fsdp"), (3, "fsdp")):  # each leg stops mid-epoch
        leg = spawn(fit_full_weights, out, world_size=size, strategy=strategy, stop_after=5,
                    **flags)[0]  # fmt: skip
        assert leg["step"] == (5 if size == 2 else 10)
    last = spawn(fit_full_weights, out, world_size=2, strategy="ddp", **flags)[0]  # 3 -> 2, DDP
    assert last["resumed_from"] == latest_dcp(out)
    assert last["step"] == straight["step"] == 16
    assert_same(last["weights"], straight["weights"], **CLOSE)
    assert_same(last["optimizer"], straight["optimizer"], **CLOSE)


@pytest.mark.parametrize("strategy", [FSDP, "ddp"])
def test_a_converted_dcp_checkpoint_is_the_full_checkpoint_of_the_same_run(
    spawn, tmp_path, capsys, strategy
):
    out = tmp_path / "run"
    spawn(fit_then_save_full, str(out), world_size=2, strategy=strategy)
    converted = tmp_path / "converted.pth"
    # In this process: no process group, another world size than the checkpoint's.
    assert convert_checkpoint.main([latest_dcp(out), str(converted)]) == 0
    ours = torch.load(converted, weights_only=True)
    full = torch.load(out / "checkpoints" / LATEST, weights_only=True)
    # Everything but the format's own name and the clock (the second save came later).
    assert_same(ours, full, skip={"/config/ckpt_format", "/train_window/seconds"})
    assert ours["config"]["ckpt_format"] == "dcp" and full["config"]["ckpt_format"] == "full"
    # --resume and --init-from take the dcp directory and the converted file alike.
    for how, flags in (("resume", {"epochs": 3}), ("init_from", {"epochs": 1})):
        a = spawn(fit_full_weights, str(tmp_path / f"{how}-a"), **{how: latest_dcp(out)}, **flags)
        b = spawn(fit_full_weights, str(tmp_path / f"{how}-b"), **{how: str(converted)}, **flags)
        assert a[0]["step"] == b[0]["step"] and a[0]["step"] > 0, how
        assert_same(a[0]["weights"], b[0]["weights"], where=how)
    # An output that cannot be written: a runtime failure, one line naming it.
    capsys.readouterr()
    (tmp_path / "dir.pth").mkdir()
    assert convert_checkpoint.main([latest_dcp(out), str(tmp_path / "dir.pth")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write") and "dir.pth" in err[0]


@needs_fsdp2
def test_a_failed_dcp_save_leaves_latest_on_the_previous_complete_checkpoint(spawn, tmp_path):
    flags = dict(strategy="fsdp", ckpt_every=2)
    reference = tmp_path / "ref"
    spawn(fit_full_weights, str(reference), world_size=2, stop_after=2, ckpt_format="dcp", **flags)
    out = tmp_path / "run"
    errors = spawn(fit_with_a_failing_dcp_save, str(out), 2, world_size=2, **flags)
    assert all("No space left on device" in e and "cannot write checkpoint" in e for e in errors)
    assert os.readlink(latest_dcp(out)) == "checkpoint_step00000002.dcp"
    saved = checkpoint_dcp.load_full(checkpoint_dcp.load_run_state(latest_dcp(out)))
    expected = checkpoint_dcp.load_full(checkpoint_dcp.load_run_state(latest_dcp(reference)))
    assert saved["step"] == 2
    assert_same(saved["model_state_dict"], expected["model_state_dict"])
    assert_same(saved["optimizer_state_dict"], expected["optimizer_state_dict"])
    assert not (out / "checkpoints" / "checkpoint_step00000004.dcp").exists()


@needs_fsdp2
def test_a_checkpoint_missing_a_shard_file_is_never_resumed_from(spawn, tmp_path, capsys):
    # A rank whose --out is not shared writes its shards elsewhere: latest misses a file.
    flags = dict(strategy="fsdp", ckpt_every=2, ckpt_format="dcp")
    out = tmp_path / "run"
    spawn(fit_full_weights, str(out), world_size=2, stop_after=4, **flags)
    latest = os.path.realpath(latest_dcp(out))
    assert latest.endswith("checkpoint_step00000004.dcp")
    shard = sorted(f for f in os.listdir(latest) if f.endswith(".distcp"))[-1]  # rank 1's
    os.remove(os.path.join(latest, shard))
    capsys.readouterr()
    assert convert_checkpoint.main([latest_dcp(out), str(tmp_path / "o.pth")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "incomplete dcp checkpoint" in err[0] and latest in err[0], err
    resumed = spawn(fit_full_weights, str(out), world_size=2, stop_after=1, **flags)[0]
    previous = str(out / "checkpoints" / checkpoint_dcp.PREVIOUS)
    assert resumed["resumed_from"] == previous and resumed["step"] == 3
