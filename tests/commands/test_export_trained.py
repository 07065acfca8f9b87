"""Export what the trainer wrote: a 2-rank dcp checkpoint of a Hugging Face GPT-2 (tied
embeddings) to safetensors and a directory that ``from_pretrained`` loads offline, which
evaluates to the run's recorded accuracy."""

from __future__ import annotations

import socket

import pytest
import torch

from refddp import export
from tests.rank_tasks import fit, tiny_config
from tests.user_code import token_datasets

pytest.importorskip("safetensors", reason="the export extra: pip install 'refddp[export]'")
transformers = pytest.importorskip("transformers", reason="the Hugging Face model")
from safetensors.torch import load_file  # noqa: E402

MODEL = "tests.user_code:next_token_gpt2"
FLAGS = dict(model=MODEL, data="tests.user_code:token_datasets", input_dim=4, num_classes=8)


@pytest.mark.slow  # ~27 s here: two ranks and this process import transformers
def test_a_trained_dcp_checkpoint_exports_to_weights_that_evaluate_to_its_metric(
    spawn, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    trained = spawn(fit, str(out), world_size=2, ckpt_format="dcp", **FLAGS)[0]
    source = str(out / "checkpoints" / "checkpoint_latest.dcp")
    assert export.main([source, str(tmp_path / "gpt2"), "--model", MODEL]) == 0

    weights = load_file(tmp_path / "gpt2.safetensors")
    assert set(weights) == set(trained["weights"])  # lm_head.weight and transformer.wte.weight
    for key, value in trained["weights"].items():
        assert torch.equal(weights[key], value), key

    def no_network(*args, **kwargs):
        raise AssertionError(f"from_pretrained reached for the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2", dtype=torch.float64)
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained["weights"][key]), key
    _, val = token_datasets(tiny_config("unused", **FLAGS))
    with torch.no_grad():
        logits = model(input_ids=val.x).logits[:, -1]
    accuracy = (logits.argmax(dim=1) == val.y).double().mean().item()
    assert accuracy == pytest.approx(trained["result"]["metrics"]["val_acc"], abs=1e-12)
