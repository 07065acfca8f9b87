"""Checkpoints: atomic, clean keys, weights-only, and every bad file is one line naming it."""

import errno
import inspect
import logging
import os
import signal
import subprocess
import sys
from collections import namedtuple

import pytest
import torch
from torch import nn

from refddp.checkpoints import formats as checkpoint_formats
from refddp.checkpoints import loading as ckpt
from refddp.checkpoints.full import BEST, LATEST, PREVIOUS, write_checkpoint
from refddp.checkpoints.run_files import RunFileError, hold_run_directory
from refddp.checkpoints.run_state import (
    CheckpointError,
    check_model_compatible,
    clean_state_dict,
    rng_state,
    set_rng_state,
    unwrap,
)
from refddp.config.schema import TrainConfig
from refddp.workload.models import build_model


def state(value: float = 1.0) -> dict:
    return {
        "model_state_dict": {"w": torch.full((3,), value)},
        "optimizer_state_dict": {},
        "scaler_state_dict": {},
        "epoch": 0,
        "step": int(value),
        "world_size": 1,
        "config": TrainConfig().to_dict(),
        "metrics": {},
    }


def test_round_trip_is_weights_only_loadable(tmp_path):
    write_checkpoint(state(2.0), str(tmp_path), is_best=True)
    latest = tmp_path / "checkpoints" / LATEST
    loaded = torch.load(latest, weights_only=True)
    assert loaded["step"] == 2 and torch.equal(
        loaded["model_state_dict"]["w"], torch.full((3,), 2.0)
    )
    assert torch.load(tmp_path / "checkpoints" / BEST, weights_only=True)["step"] == 2


def test_each_write_keeps_the_one_before(tmp_path):
    write_checkpoint(state(1.0), str(tmp_path), is_best=False)
    write_checkpoint(state(2.0), str(tmp_path), is_best=False)
    directory = tmp_path / "checkpoints"
    assert ckpt.load_checkpoint(str(directory / LATEST))["step"] == 2
    assert ckpt.load_checkpoint(str(directory / PREVIOUS))["step"] == 1


def test_crash_while_writing_leaves_the_old_checkpoint_intact(tmp_path, monkeypatch):
    write_checkpoint(state(1.0), str(tmp_path), is_best=False)
    real_save = torch.save

    def crash_half_way(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")
        raise RuntimeError("simulated crash during write")

    monkeypatch.setattr(torch, "save", crash_half_way)
    with pytest.raises(RunFileError, match="simulated crash"):
        write_checkpoint(state(2.0), str(tmp_path), is_best=False)
    monkeypatch.setattr(torch, "save", real_save)
    directory = tmp_path / "checkpoints"
    assert ckpt.load_checkpoint(str(directory / LATEST))["step"] == 1
    assert [p for p in os.listdir(directory) if "tmp" in p] == [], "no temporary file left"


def test_disk_full_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch):
    write_checkpoint(state(1.0), str(tmp_path), is_best=False)

    def no_space(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(
        RunFileError, match=r"cannot write checkpoint .*: No space left on device$"
    ):
        write_checkpoint(state(2.0), str(tmp_path), is_best=False)
    monkeypatch.undo()
    assert ckpt.load_checkpoint(str(tmp_path / "checkpoints" / LATEST))["step"] == 1


class Pickled:
    pass


class RunsACommand:
    """Unpickled, it would run ``touch``: what a malicious checkpoint holds."""

    def __reduce__(self):
        return (os.system, ("touch should-never-exist",))


@pytest.mark.parametrize(
    ("payload", "named"),
    [(Pickled(), "Pickled"), (RunsACommand(), "system")],
    ids=["a-class", "a-blocked-callable"],
)
def test_checkpoint_needing_pickled_code_is_refused(tmp_path, monkeypatch, payload, named):
    # torch words the two apart ("not an allowed global", "whose module posix is blocked");
    # the second was reported as a corrupt file, and ``--resume auto`` fell back past it.
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pth"
    torch.save({**state(), "payload": payload}, path)
    with pytest.raises(CheckpointError, match=rf"refused: it needs pickled code \(\S*{named}\)"):
        ckpt.load_checkpoint(str(path))
    assert not (tmp_path / "should-never-exist").exists()


def test_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / "cut.pth"
    torch.save(state(), path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(
        CheckpointError, match=r"cut.pth: corrupt or truncated checkpoint"
    ) as e:
        ckpt.load_checkpoint(str(path))
    assert "\n" not in str(e.value)


def test_foreign_file_is_not_a_refddp_checkpoint(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"weights": torch.ones(2)}, path)
    with pytest.raises(
        CheckpointError, match=r"not a refddp checkpoint \(missing model_state_dict"
    ):
        ckpt.load_checkpoint(str(path))


def test_auto_resume_falls_back_to_the_previous_checkpoint_with_a_warning(tmp_path, caplog):
    write_checkpoint(state(1.0), str(tmp_path), is_best=False)
    write_checkpoint(state(2.0), str(tmp_path), is_best=False)
    latest = tmp_path / "checkpoints" / LATEST
    latest.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="refddp"):
        path, loaded = ckpt.load_resume_checkpoint(TrainConfig(out=str(tmp_path)))
    assert path.endswith(PREVIOUS) and loaded["step"] == 1
    assert (
        "checkpoint_latest.pth: corrupt" in caplog.text and "checkpoint_previous.pth" in caplog.text
    )


def test_corrupt_latest_without_a_fallback_is_an_error(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / LATEST).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"checkpoint_latest.pth: corrupt"):
        ckpt.load_resume_checkpoint(TrainConfig(out=str(tmp_path)))


def test_resume_path_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"^resume: checkpoint not found: .*gone.pth$"):
        ckpt.load_resume_checkpoint(TrainConfig(resume=str(tmp_path / "gone.pth")))


def test_ddp_and_compile_prefixes_are_stripped():
    sd = {"module._orig_mod.net.0.weight": 1, "module.net.0.bias": 2, "head.weight": 3}
    assert clean_state_dict(sd) == {"net.0.weight": 1, "net.0.bias": 2, "head.weight": 3}
    wrapped = nn.Sequential(nn.Linear(2, 2))
    assert unwrap(wrapped) is wrapped


def test_checkpoint_of_another_model_names_missing_and_unexpected_keys():
    mlp = build_model(TrainConfig(model="mlp", depth=1))
    other = build_model(TrainConfig(model="cnn")).state_dict()
    with pytest.raises(
        CheckpointError,
        match=r"x.pth: does not fit this model; missing keys: net.0.weight.*; unexpected keys: features",
    ):
        check_model_compatible(mlp, other, "x.pth")
    wider = build_model(TrainConfig(model="mlp", depth=1, hidden_size=64)).state_dict()
    with pytest.raises(
        CheckpointError, match=r"shape mismatch: net.0.weight \(64, 32\) vs \(128, 32\)"
    ):
        check_model_compatible(mlp, wider, "x.pth")


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    import random

    import numpy as np

    saved = rng_state()
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.save({"rng": saved}, tmp_path / "rng.pth")
    set_rng_state(torch.load(tmp_path / "rng.pth", weights_only=True)["rng"])
    assert torch.equal(torch.rand(2), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_a_dangling_latest_link_is_named_not_taken_for_a_fresh_start(tmp_path, caplog):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "checkpoint_latest.dcp").symlink_to("checkpoint_step00000004.dcp")  # gone
    with pytest.raises(CheckpointError, match=r"checkpoint_latest.dcp is a dangling link"):
        ckpt.load_resume_checkpoint(TrainConfig(out=str(tmp_path)))
    (directory / "checkpoint_latest.dcp").unlink()
    # With a readable previous checkpoint: resume from it, with a warning naming the link.
    write_checkpoint(state(2.0), str(tmp_path), is_best=False)
    os.rename(directory / LATEST, directory / PREVIOUS)
    os.symlink("gone.pth", directory / LATEST)
    with caplog.at_level(logging.WARNING, logger="refddp"):
        path, loaded = ckpt.load_resume_checkpoint(TrainConfig(out=str(tmp_path)))
    assert path.endswith(PREVIOUS) and loaded["step"] == 2
    assert "checkpoint_latest.pth is a dangling link" in caplog.text


def test_every_format_module_provides_the_whole_interface():
    interface = checkpoint_formats.CheckpointFormat
    names = {*interface.__annotations__, *(n for n in vars(interface) if not n.startswith("_"))}
    assert {"owns", "latest", "write", "load_run_state", "restore_tensors", "load_full"} <= names
    for name in checkpoint_formats.NAMES:
        module = checkpoint_formats.named(name)
        assert [n for n in sorted(names) if not hasattr(module, n)] == [], name
        for method in sorted(n for n in names if callable(getattr(interface, n, None))):
            wanted = list(inspect.signature(getattr(interface, method)).parameters)[1:]
            given = list(inspect.signature(getattr(module, method)).parameters)
            assert given[: len(wanted)] == wanted, f"{name}.{method}{given}"


class OnAGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU (this machine has none): ``.cpu()`` gives the
    plain tensor, as a CUDA tensor's would."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)

    def cpu(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()


Pair = namedtuple("Pair", "a b")


def test_the_written_checkpoint_holds_only_cpu_tensors_ties_kept(tmp_path):
    shared = torch.ones(2, 3).as_subclass(OnAGpu)
    state_on_gpu = {**state(), "model_state_dict": {"embed": shared, "head": shared},
                    "extra": Pair(torch.zeros(1).as_subclass(OnAGpu), 3)}  # fmt: skip
    write_checkpoint(state_on_gpu, str(tmp_path), is_best=False)
    saved = torch.load(tmp_path / "checkpoints" / LATEST, weights_only=False)
    tensors = [*saved["model_state_dict"].values(), saved["extra"].a]
    assert all(type(t) is torch.Tensor for t in tensors), [type(t) for t in tensors]
    assert saved["extra"].b == 3
    embed, head = saved["model_state_dict"].values()
    assert embed.untyped_storage().data_ptr() == head.untyped_storage().data_ptr(), "tied: one"


def test_a_state_without_gpu_tensors_is_written_as_it_is():
    from refddp.checkpoints.full import on_cpu

    model_state = nn.BatchNorm1d(2).state_dict()  # an OrderedDict with _metadata
    whole = {**state(), "model_state_dict": model_state, "rng": [torch.ones(1), (1, 2)]}
    assert on_cpu(whole) is whole


HOLD_THEN_FORK = """
import os, sys, time
from refddp.checkpoints.run_files import hold_run_directory
held = hold_run_directory(sys.argv[1])
child = os.fork()
if child == 0:  # a loader worker, forked from the run, which may outlive it for seconds
    for fd in (1, 2):  # (the test reads the run's output to its end)
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # the run ends
"""


def test_the_run_directory_lock_ends_with_its_process_not_with_the_children_it_forked(tmp_path):
    done = subprocess.run([sys.executable, "-c", HOLD_THEN_FORK, str(tmp_path)],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    child = int(done.stdout)
    try:
        held = hold_run_directory(str(tmp_path))  # the rerun, while the worker still lives
        assert held is not None
        held.close()
    finally:
        os.kill(child, signal.SIGKILL)
