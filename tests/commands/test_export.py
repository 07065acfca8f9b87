"""``python -m refddp.export``: safetensors that load strict into the bare model (tied weights
too), a Hugging Face directory that loads offline, the import rule, and bad input.

The checkpoints here are written by refddp's own writer (``run_state.build_state``, then
``checkpoint.write_checkpoint``) in this process; ``tests/commands/test_export_trained.py`` exports
what the trainer wrote, in the dcp format.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from refddp import export
from refddp.checkpoints import run_state
from refddp.checkpoints.full import write_checkpoint
from refddp.checkpoints.run_state import rng_state
from refddp.config.schema import TrainConfig
from refddp.launch.dist import DistContext
from refddp.training.parallel import build_parallel
from refddp.training.run_setup import build_optimizer
from refddp.training.schedule import Schedule
from refddp.workload.models import build_model

pytest.importorskip("safetensors", reason="the export extra: pip install 'refddp[export]'")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

GPT2 = "tests.user_code:gpt2"
GPT2_SIZES = {"input_dim": 4, "num_classes": 8}  # sequence length, vocabulary


def a_checkpoint(out, step=3, **fields) -> str:
    """A full-format checkpoint of a freshly built model, written as the trainer writes one."""
    c = TrainConfig(out=str(out), device="cpu", **fields)
    model = build_model(c)
    with torch.no_grad():  # weights no init reproduces: an export must carry these
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    parallel = build_parallel(model, c, DistContext(0, 1, 0, "cpu", "gloo"))
    optimizer = build_optimizer(model, c)
    parts = run_state.RunParts(
        parallel,
        optimizer,
        Schedule(optimizer, c, total_steps=10),
        torch.amp.GradScaler("cpu", enabled=False),
    )
    state = run_state.build_state(parts, run_state.Position(step=step), c, c.batch_size, 10,
                                  [{"rng": rng_state(), "loss": [0.0, 0]}])  # fmt: skip
    return write_checkpoint(state, str(out), is_best=False)


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_safetensors_file_loads_strict_into_the_bare_model_with_config_and_step(
    tmp_path, capsys
):
    source = a_checkpoint(tmp_path / "run", step=7, model="convnet")  # batch norm: buffers
    assert export.main([source, str(tmp_path / "model")]) == 0
    assert capsys.readouterr().out.split() == ["wrote", str(tmp_path / "model.safetensors")]
    saved = torch.load(source, weights_only=True)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        metadata = f.metadata()
    assert json.loads(metadata["config"]) == saved["config"] and metadata["step"] == "7"
    bare = build_model(json.loads(metadata["config"]))  # a fresh init, not the checkpoint's
    bare.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    for key, value in bare.state_dict().items():
        assert torch.equal(value, saved["model_state_dict"][key]), key
    assert not (tmp_path / "model").exists(), "not a Hugging Face model: no directory"
    assert oct(os.stat(tmp_path / "model.safetensors").st_mode & 0o777) == oct(
        0o666 & ~_umask()
    ), "the file's mode follows the umask, as any file written with open()"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_tied_gpt2_weights_are_two_tensors_and_the_directory_loads_offline(
    tmp_path, capsys, monkeypatch
):
    transformers = pytest.importorskip("transformers", reason="the Hugging Face directory")
    source = a_checkpoint(tmp_path / "run", model=GPT2, **GPT2_SIZES)
    saved = torch.load(source, weights_only=True)["model_state_dict"]
    tied = ("lm_head.weight", "transformer.wte.weight")
    assert saved[tied[0]].data_ptr() == saved[tied[1]].data_ptr(), "the checkpoint shares them"
    assert export.main([source, str(tmp_path / "gpt2.safetensors"), "--model", GPT2]) == 0
    assert capsys.readouterr().out.split() == [
        "wrote", str(tmp_path / "gpt2.safetensors"), "wrote", str(tmp_path / "gpt2") + os.sep,
    ]  # fmt: skip

    weights = load_file(tmp_path / "gpt2.safetensors")
    assert set(weights) == set(saved)
    for key in saved:
        assert torch.equal(weights[key], saved[key]), key
    bare = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=8, n_positions=4, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0))  # fmt: skip
    bare.load_state_dict(weights, strict=True)

    def no_network(*args, **kwargs):
        raise AssertionError(f"from_pretrained reached for the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    assert loaded.lm_head.weight is loaded.transformer.wte.weight, "still tied"
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_code_only_the_checkpoint_names_is_not_imported(tmp_path, capsys):
    # A module that does not exist: importing it would fail differently from refusing it.
    source = a_checkpoint(tmp_path / "run")
    state = torch.load(source, weights_only=True)
    state["config"]["model"] = "not_installed.models:build"
    torch.save(state, source)
    out = str(tmp_path / "m")
    assert export.main([source, out]) == 2
    line = error_line(capsys)
    assert "model: refused to import 'not_installed.models:build'" in line, line
    assert "--model not_installed.models:build or --trust-checkpoint-code" in line
    assert "--no-hf" in line
    assert not (tmp_path / "m.safetensors").exists()
    for allowed in (["--trust-checkpoint-code"], ["--model", "not_installed.models:build"]):
        assert export.main([source, out, *allowed]) == 2
        assert "cannot import module 'not_installed.models'" in error_line(capsys), allowed
    assert export.main([source, out, "--no-hf"]) == 0, "nothing built, nothing imported"
    assert set(load_file(out + ".safetensors")) == set(state["model_state_dict"])


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    source = a_checkpoint(tmp_path / "run")
    (tmp_path / "not_a_checkpoint.pth").write_bytes(b"hello")
    (tmp_path / "empty.dcp").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("a user's file")
    out = str(tmp_path / "m")
    cases = [
        ([str(tmp_path / "missing.pth"), out], "missing.pth: not found"),
        ([str(tmp_path / "not_a_checkpoint.pth"), out], "corrupt or truncated checkpoint"),
        ([str(tmp_path / "empty.dcp"), out], "empty.dcp: not a dcp checkpoint"),
        ([source, str(tmp_path / "no" / "m")], "does not exist"),
        ([source, str(tmp_path) + os.sep], "name the output file"),
        ([source, out, "--hf"], "is not a transformers.PreTrainedModel" if _has("transformers")
         else "--hf needs transformers: pip install transformers"),
        ([source, out, "--model", "cnn"], "does not fit this model"),
        ([source], "arguments are required: out"),
        ([source, out, "--unknown"], "unrecognized arguments: --unknown"),
    ]
    if _has("transformers"):  # a Hugging Face model whose directory would replace a user's
        gpt2 = a_checkpoint(tmp_path / "gpt2run", model=GPT2, **GPT2_SIZES)
        cases.append(([gpt2, str(tmp_path / "taken"), "--model", GPT2], "taken: exists"))
    before = sorted(os.listdir(tmp_path))
    for argv, named in cases:
        assert export.main(argv) == 2, argv
        line = error_line(capsys)
        assert line.startswith("error: ") and named in line, (argv, line)
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(tmp_path / "taken") == ["notes.txt"]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_a_missing_optional_package_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    source = a_checkpoint(tmp_path / "run")
    monkeypatch.setitem(__import__("sys").modules, "safetensors.torch", None)  # not installed
    assert export.main([source, str(tmp_path / "m")]) == 2
    assert "export needs safetensors: pip install 'refddp[export]'" in error_line(capsys)
    monkeypatch.undo()
    monkeypatch.setattr(export.importlib.util, "find_spec",
                        lambda name: None if name == "transformers" else True)  # fmt: skip
    assert export.main([source, str(tmp_path / "m"), "--hf"]) == 2
    assert "--hf needs transformers: pip install transformers" in error_line(capsys)
    assert not os.path.exists(tmp_path / "m.safetensors")


def test_a_failed_write_is_one_line_exit_1_and_leaves_nothing_behind(
    tmp_path, capsys, monkeypatch
):
    source = a_checkpoint(tmp_path / "run")
    (tmp_path / "m.safetensors").write_bytes(b"the previous export")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    assert export.main([source, str(tmp_path / "m")]) == 1
    line = error_line(capsys)
    assert line == f"error: cannot write {tmp_path / 'm.safetensors'}: No space left on device"
    assert (tmp_path / "m.safetensors").read_bytes() == b"the previous export"
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "run"], "no temporary file left"
