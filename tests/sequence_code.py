"""User code for sequence workloads, named as ``package.module:callable`` as a real project would:
padded variable-length token data (dict samples, HF style), a tiny language model, a tiny
Hugging Face GPT-2 (random init, nothing downloaded), and user losses and metrics.

Sizes come from the config: ``num_classes`` is the vocabulary, ``input_dim`` the padded length,
``hidden_size`` and ``depth`` the model's width and layers. Real lengths vary from 2 to
``input_dim`` tokens, so micro-batches hold very different numbers of targets: a loss
normalised per micro-batch or per rank weights tokens differently from the global mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0


class TokenDataset(torch.utils.data.Dataset):
    """Dict samples: ``input_ids``, ``attention_mask`` and ``labels`` (-100 where nothing is
    predicted). ``shifted``: ``labels[t]`` is the token after ``t`` (for ``--loss
    cross_entropy``); else ``labels`` are the input ids, which an HF causal LM shifts itself."""

    def __init__(self, ids: torch.Tensor, lengths: torch.Tensor, shifted: bool):
        self.ids, self.lengths, self.shifted = ids, lengths, shifted

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, length = self.ids[index], int(self.lengths[index])
        mask = (torch.arange(len(ids)) < length).long()
        if self.shifted:
            labels = torch.full_like(ids, -100)
            labels[: length - 1] = ids[1:length]
        else:
            labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
        return {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


def _token_data(config, shifted: bool) -> tuple[TokenDataset, TokenDataset]:
    g = torch.Generator().manual_seed(config.seed + 777)
    vocab, width = config.num_classes, config.input_dim
    # A learnable chain: each token mostly follows from the one before it.
    table = torch.randint(1, vocab, (vocab,), generator=g)

    def make(n: int) -> TokenDataset:
        ids = torch.empty(n, width, dtype=torch.int64)
        ids[:, 0] = torch.randint(1, vocab, (n,), generator=g)
        for t in range(1, width):
            noise = torch.randint(1, vocab, (n,), generator=g)
            keep = torch.rand(n, generator=g) < 0.8
            ids[:, t] = torch.where(keep, table[ids[:, t - 1]], noise)
        lengths = torch.randint(2, width + 1, (n,), generator=g)
        return TokenDataset(ids, lengths, shifted)

    return make(config.train_size), make(config.val_size)


def shifted_sequences(config):
    """Targets already shifted: for ``--loss cross_entropy`` (token-level) and user losses."""
    return _token_data(config, shifted=True)


def causal_sequences(config):
    """Labels are the input ids (-100 at padding): for an HF causal LM with ``--loss model``."""
    return _token_data(config, shifted=False)


class TinyLM(nn.Module):
    """Embeddings, a causal running mean over the sequence, an MLP head: logits ``[B, T, V]``."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(2 * hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids, attention_mask=None):
        h = self.embed(input_ids)
        running = h.cumsum(1) / torch.arange(1, h.shape[1] + 1, device=h.device).view(1, -1, 1)
        return self.head(F.gelu(self.mix(torch.cat([h, running], -1))))


def tiny_lm(config):
    return TinyLM(config.num_classes, config.hidden_size)


def tiny_gpt2(config):
    """A Hugging Face GPT-2 built from a config (random init from the seed, no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=config.num_classes,
            n_positions=config.input_dim,
            n_embd=config.hidden_size,
            n_layer=config.depth,
            n_head=2,
            resid_pdrop=config.dropout,
            embd_pdrop=config.dropout,
            attn_pdrop=config.dropout,
            bos_token_id=None,  # GPT-2's own (50256) lies outside this vocabulary
            eos_token_id=None,
        )
    )
    model.loss_type = "ForCausalLM"  # what it is; unset, HF warns on every forward
    return model


class LossFree(nn.Module):
    """A model whose output has no loss: what ``--loss model`` must refuse in one line."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.lm = TinyLM(vocab, hidden)

    def forward(self, input_ids, attention_mask=None, labels=None):
        return {"logits": self.lm(input_ids)}


def loss_free_lm(config):
    return LossFree(config.num_classes, config.hidden_size)


class MeanLossLM(nn.Module):
    """Computes its own token-mean loss and takes no ``num_items_in_batch``: refddp can only
    normalise it per micro-batch (and says so)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.lm = TinyLM(vocab, hidden)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.lm(input_ids)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def mean_loss_lm(config):
    return MeanLossLM(config.num_classes, config.hidden_size)


def summed_token_loss(outputs, batch):
    """A user loss returning (loss_sum, count): refddp normalises it exactly."""
    labels = batch["labels"]
    total = F.cross_entropy(outputs.flatten(0, 1), labels.flatten(), ignore_index=-100,
                            reduction="sum")  # fmt: skip
    return total, (labels != -100).sum()


def mean_token_loss(outputs, batch):
    """A user loss returning a batch mean: micro-batch means."""
    return F.cross_entropy(outputs.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)


def token_metrics(outputs, batch):
    """User metrics as sums: top-3 hits per target token (a ratio), and the targets seen."""
    logits = outputs if isinstance(outputs, torch.Tensor) else outputs["logits"]
    labels = batch["labels"]
    scored = labels != -100
    top3 = logits.topk(3, dim=-1).indices
    hits = ((top3 == labels.unsqueeze(-1)).any(-1) & scored).sum()
    return {"top3": (hits, scored.sum()), "tokens": scored.sum()}


class PerPositionClassifier(nn.Module):
    """Outputs ``[B, 3, C]`` for a classification task whose targets are ``[B]``: a shape that
    does not fit, which ``--loss cross_entropy`` must refuse in one line."""

    def __init__(self, features: int, classes: int):
        super().__init__()
        self.linear = nn.Linear(features, 3 * classes)
        self.classes = classes

    def forward(self, x):
        return self.linear(x).view(len(x), 3, self.classes)


def wrong_shape_model(config):
    return PerPositionClassifier(config.input_dim, config.num_classes)


class _Relabelled(torch.utils.data.Dataset):
    def __init__(self, base, change):
        self.base, self.change = base, change

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        return self.change(dict(self.base[index]))


def _drop_labels(sample):
    del sample["labels"]
    return sample


def _ignore_every_label(sample):
    sample["labels"] = torch.full_like(sample["labels"], -100)
    return sample


def no_target_sequences(config):
    """Every label -100: a batch with no targets at all."""
    train, val = shifted_sequences(config)
    return _Relabelled(train, _ignore_every_label), val


def unlabelled_sequences(config):
    """Dict samples without ``labels``."""
    train, val = shifted_sequences(config)
    return _Relabelled(train, _drop_labels), _Relabelled(val, _drop_labels)


def labels_missing_on_rank_1(config):
    """A user bug seen on one rank only: rank 1's samples have no labels."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() == 1:
        return unlabelled_sequences(config)
    return shifted_sequences(config)


def per_token_losses(outputs, batch):
    """A user bug: a loss per token, not reduced to a scalar."""
    return F.cross_entropy(outputs.transpose(1, 2), batch["labels"], reduction="none")


# Flags of small, exact (float64) sequence runs, shared by the tests.
GLOBAL_BATCH = 12  # divides by 1, 2, 3 ranks and 2, 3, 4 micro-batches
TOKEN_RUN = dict(
    model="tests.sequence_code:tiny_lm",
    data="tests.sequence_code:shifted_sequences",
    num_classes=12,  # the vocabulary
    input_dim=10,  # the padded length
    train_size=96,
    val_size=37,
    global_batch_size=GLOBAL_BATCH,
    epochs=1,
    optimizer="sgd",
    momentum=0.0,
    lr=0.5,
    lr_schedule="constant",
)
GPT2_RUN = dict(
    TOKEN_RUN,
    model="tests.sequence_code:tiny_gpt2",
    data="tests.sequence_code:causal_sequences",
    loss="model",
    hidden_size=16,
    depth=2,
    dropout=0.0,
    lr=0.2,
)
