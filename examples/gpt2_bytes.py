"""GPT-2 from Hugging Face ``transformers`` (random init from a config: nothing is downloaded),
trained on byte-level text read from files on this machine.

    python -m refddp.train --config examples/gpt2_bytes.yaml --nproc 2 --out runs/gpt2

Tokens are bytes (vocabulary 256). The text is every file under ``$REFDDP_TEXT`` (a directory,
read recursively, or one file), by default Python's own standard-library sources, which are on
any machine that runs Python. It is cut into sequences of varying length (a quarter of
``input_dim`` bytes to all of them), padded to ``input_dim`` with label -100: the model's loss
(``--loss model``: GPT-2 shifts the labels itself) counts real tokens only, and refddp
normalises it by the global batch's token count. The last ``val_size`` sequences, from the end
of the text, are the validation set.

Config fields it reads: ``input_dim`` (context length), ``hidden_size`` (embedding width),
``depth`` (layers), ``dropout``, ``train_size`` / ``val_size`` (sequences), ``seed``.
"""

from __future__ import annotations

import os

import torch

VOCAB = 256  # bytes


def text_files() -> list[str]:
    """The files whose bytes are the text, in a fixed order."""
    root = os.environ.get("REFDDP_TEXT") or os.path.dirname(os.__file__)
    if os.path.isfile(root):
        return [root]
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        text = sorted(f for f in files if f.endswith((".py", ".txt", ".md")))
        found += [os.path.join(directory, f) for f in text]
    return found


def read_bytes(needed: int) -> torch.Tensor:
    """At least ``needed`` bytes of text (fewer only if the files hold fewer)."""
    chunks, total = [], 0
    for path in text_files():
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data)
        if total >= needed:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:needed]), dtype=torch.uint8).long()


class ByteSequences(torch.utils.data.Dataset):
    """Dict samples (``input_ids``, ``attention_mask``, ``labels``), as HF models take them."""

    def __init__(self, text: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int):
        self.text, self.starts, self.lengths, self.width = text, starts, lengths, width

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start, length = int(self.starts[index]), int(self.lengths[index])
        ids = torch.zeros(self.width, dtype=torch.int64)
        ids[:length] = self.text[start : start + length]
        mask = (torch.arange(self.width) < length).long()
        labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def data(config):
    width = config.input_dim
    g = torch.Generator().manual_seed(config.seed)
    n = config.train_size + config.val_size
    lengths = torch.randint(max(2, width // 4), width + 1, (n,), generator=g)
    text = read_bytes(int(lengths.sum()))
    if len(text) < int(lengths.sum()):
        raise ValueError(f"the text files hold {len(text)} bytes; {int(lengths.sum())} needed")
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    train = slice(0, config.train_size)
    val = slice(config.train_size, n)
    return (
        ByteSequences(text, starts[train], lengths[train], width),
        ByteSequences(text, starts[val], lengths[val], width),
    )


def model(config):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=config.input_dim,
            n_embd=config.hidden_size,
            n_layer=config.depth,
            n_head=max(1, config.hidden_size // 32),
            resid_pdrop=config.dropout,
            embd_pdrop=config.dropout,
            attn_pdrop=config.dropout,
            bos_token_id=None,  # GPT-2's own (50256) lies outside a byte vocabulary
            eos_token_id=None,
        )
    )
    model.loss_type = "ForCausalLM"  # what it is; unset, HF warns on every forward
    return model


def gpt2_small(config):
    """GPT-2 small's own shape, 124M parameters (its 50,257-token vocabulary, 12 heads of 64,
    1,024 positions), over the same byte text: the size the GPU benchmark trains
    (benchmarks/step_overhead.py ``--models gpt2_124m``). ``dropout`` is read from the
    config, and ``input_dim`` checked against the 1,024 positions; the byte tokens use 256 of
    the vocabulary's rows."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from refddp.config.schema import ConfigError

    if config.input_dim > 1024:
        raise ConfigError(f"input_dim: GPT-2 small has 1024 positions, not {config.input_dim}")
    p = config.dropout
    model = GPT2LMHeadModel(GPT2Config(resid_pdrop=p, embd_pdrop=p, attn_pdrop=p))
    model.loss_type = "ForCausalLM"
    return model
