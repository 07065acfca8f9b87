"""Sequence workloads through the real trainer (issue 21): dict batches, token-level losses, a
model that computes its own loss (a Hugging Face GPT-2), user losses and metrics.

The central guarantee: a step's loss, and so its gradient, is the mean over every target of
the global batch. On padded variable-length sequences micro-batches hold very different
numbers of targets, so normalising per micro-batch or per rank changes the weights; exact
normalisation gives the same weights at any world size and accumulation split.
"""

import importlib.util
import json
import math

import pytest
import torch
import torch.nn.functional as F

from refddp.workload.data import build_datasets
from refddp.workload.models import build_model
from tests.rank_tasks import fit, tiny_config
from tests.sequence_code import GLOBAL_BATCH, GPT2_RUN, TOKEN_RUN

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="the examples extra (transformers) is not installed")

TOKENS, GPT2 = TOKEN_RUN, GPT2_RUN


def assert_close_weights(a, b, rtol, atol=0.0):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


def history(out):
    return [json.loads(line) for line in open(out / "history.jsonl")]


def run(spawn, out, world_size, **flags):
    return spawn(fit, str(out), world_size=world_size, **flags)[0]


def test_micro_batches_of_the_test_data_hold_very_different_numbers_of_targets():
    """The premise of the normalisation tests: without it they could not tell the schemes apart."""
    train, _ = build_datasets(tiny_config("unused", **TOKENS))
    per_micro_batch = [
        sum(int((train[i]["labels"] != -100).sum()) for i in range(start, start + 3))
        for start in range(0, 48, 3)
    ]
    assert max(per_micro_batch) >= 2 * min(per_micro_batch)


@pytest.mark.parametrize("loss", ["cross_entropy", "tests.sequence_code:summed_token_loss"])
def test_token_loss_gives_the_same_weights_at_any_world_size_and_accumulation_split(
    spawn, tmp_path, loss
):
    splits = [(1, 1), (1, 4), (2, 1), (2, 3), (3, 2)]  # (world size, grad_accum)
    runs = {
        split: run(spawn, tmp_path / f"w{split[0]}a{split[1]}", split[0], grad_accum=split[1],
                   loss=loss, **{k: v for k, v in TOKENS.items() if k != "loss"})  # fmt: skip
        for split in splits
    }
    reference = runs[(1, 1)]
    assert reference["step"] == 8
    for split, result in runs.items():
        # float64: equal to rounding (reduction order); a per-rank or per-micro-batch mean
        # differs here by ~1e-3.
        assert_close_weights(result["weights"], reference["weights"], rtol=1e-10, atol=1e-12)
        train_loss = history(tmp_path / f"w{split[0]}a{split[1]}")[-1]["train_loss"]
        assert math.isclose(train_loss, history(tmp_path / "w1a1")[-1]["train_loss"],
                            rel_tol=1e-12), split  # fmt: skip


def test_one_step_follows_the_gradient_of_the_mean_over_every_target_of_the_global_batch(
    spawn, tmp_path
):
    result = run(spawn, tmp_path, 2, grad_accum=3, max_steps=1, **TOKENS)
    # The same step by hand, in one process: the first global batch of epoch 0
    # (GlobalBatchSampler's order), one mean over all its targets, plain SGD.
    c = tiny_config("unused", **TOKENS)
    model = build_model(c)
    train, _ = build_datasets(c)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(c.seed))
    batch = torch.utils.data.default_collate([train[i] for i in order[:GLOBAL_BATCH].tolist()])
    logits = model(batch["input_ids"])
    F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100).backward()
    with torch.no_grad():
        expected = {name: p - c.lr * p.grad for name, p in model.named_parameters()}
    assert_close_weights(result["weights"], expected, rtol=1e-12, atol=1e-14)


@needs_transformers
def test_a_hugging_face_gpt2_computing_its_own_loss_gives_the_same_weights_at_any_split(
    spawn, tmp_path
):
    runs = {
        split: run(spawn, tmp_path / f"w{split[0]}a{split[1]}", split[0], grad_accum=split[1],
                   **GPT2)  # fmt: skip
        for split in [(1, 1), (2, 1), (1, 3), (2, 2)]
    }
    reference = runs[(1, 1)]["weights"]
    for result in runs.values():
        # HF's loss up-casts the logits to float32 (even from float64 parameters): equal to
        # float32 rounding; normalising per rank or micro-batch differs by ~1e-3 here.
        assert_close_weights(result["weights"], reference, rtol=2e-5, atol=2e-6)


@needs_transformers
def test_a_model_that_cannot_be_normalised_exactly_gets_micro_batch_means_and_says_so(spawn, tmp_path):
    from tests.rank_tasks import describe_objective

    said = spawn(describe_objective, str(tmp_path), world_size=1,
                 **dict(TOKENS, model="tests.sequence_code:mean_loss_lm", loss="model"))[0]  # fmt: skip
    assert "mean of micro-batch means" in said and "takes no num_items_in_batch" in said
    exact = spawn(describe_objective, str(tmp_path), world_size=1, **GPT2)[0]
    assert "normalised by the global batch's target count" in exact
    assert "labels[..., 1:]" in exact  # GPT-2's loss shifts its labels: so does the count


def reference_val_loss(config_flags):
    """The validation loss computed plainly: every target token of the set, one mean."""
    c = tiny_config("unused", **config_flags)
    model = build_model(c)
    _, val = build_datasets(c)
    batch = torch.utils.data.default_collate([val[i] for i in range(len(val))])
    with torch.no_grad():
        logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_validation_loss_is_the_mean_over_every_target_token_at_any_world_size(
    spawn, world_size
):
    from tests.rank_tasks import evaluate_fresh_model

    flags = dict(TOKENS, batch_size=5, metrics="tests.sequence_code:token_metrics")
    found = spawn(evaluate_fresh_model, world_size=world_size, **flags)[0]
    expected = reference_val_loss(flags)
    assert math.isclose(found["val_loss"], expected.item(), rel_tol=1e-12)
    assert math.isclose(found["val_perplexity"], math.exp(expected.item()), rel_tol=1e-12)
    _, val = build_datasets(tiny_config("unused", **flags))
    targets = sum(int((val[i]["labels"] != -100).sum()) for i in range(len(val)))
    assert found["num_targets"] == found["val_tokens"] == targets
    assert found["num_samples"] == len(val)
    assert 0 <= found["val_top3"] <= 1 and found["val_top3"] >= found["val_acc"]
