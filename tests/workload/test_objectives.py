"""The objectives in one process: how batches reach the model, what a loss sums and counts."""

from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from refddp.config.schema import ConfigError
from refddp.workload.objectives.batches import batch_size, model_inputs, targets_of, to_device
from refddp.workload.objectives.cross_entropy import CrossEntropy
from refddp.workload.objectives.model_loss import ModelLoss
from refddp.workload.objectives.user_loss import UserLoss
from refddp.workload.objectives.user_metrics import UserMetrics
from tests import sequence_code


def test_a_dict_batch_reaches_the_model_as_keywords_and_a_tuple_positionally():
    ids, labels = torch.ones(2, 3), torch.zeros(2, 3)
    assert model_inputs({"input_ids": ids, "labels": labels}, with_targets=False) == (
        (), {"input_ids": ids})  # fmt: skip
    assert model_inputs({"input_ids": ids, "labels": labels}, with_targets=True)[1].keys() == {
        "input_ids", "labels"}  # fmt: skip
    args, kwargs = model_inputs((ids, labels), with_targets=False)
    assert args == (ids,) and kwargs == {}
    assert targets_of((ids, labels), "cross_entropy") is labels
    assert batch_size(({"a": torch.ones(5, 2)}, torch.zeros(5))) == 5


def test_nested_batches_move_to_the_device_whole():
    Pair = namedtuple("Pair", "x y")
    batch = {"pair": Pair(torch.ones(2), [torch.zeros(1), "text"]), "n": 3}
    moved = to_device(batch, torch.device("meta"))
    assert moved["pair"].x.is_meta and moved["pair"].y[0].is_meta
    assert isinstance(moved["pair"], Pair) and moved["pair"].y[1] == "text" and moved["n"] == 3


def test_cross_entropy_sums_over_the_targets_and_counts_those_not_minus_100():
    logits = torch.randn(2, 4, 5, dtype=torch.float64)
    labels = torch.tensor([[1, 2, -100, -100], [0, 4, 3, -100]])
    total, count = CrossEntropy().loss(logits, {"labels": labels})
    assert count == 5
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert torch.allclose(total / count, expected)


def test_built_in_data_without_ignored_targets_counts_them_on_the_host_and_with_them_on_the_device():
    """refddp's tensor data says whether any label is -100 (``every_target_scored``); the
    objective built on it then counts a batch's targets as their number, with no device op
    per step, or counts the scored ones."""
    from refddp.config.schema import TrainConfig
    from refddp.workload.data import TensorPairDataset
    from refddp.workload.objectives import build_objective

    c = TrainConfig(input_dim=3, num_classes=4, batch_size=4)
    model = nn.Linear(3, 4)
    x, logits = torch.randn(6, 3), torch.randn(6, 4)
    scored = TensorPairDataset(x, torch.tensor([0, 1, 2, 3, 0, 1]))
    padded = TensorPairDataset(x, torch.tensor([0, -100, 2, -100, 0, 1]))
    assert scored.every_target_scored and not padded.every_target_scored
    on_host = build_objective(c, model, scored, torch.device("cpu"))
    total, count = on_host.loss(logits, (x, scored.y))
    assert isinstance(count, int) and count == 6
    assert torch.allclose(total / count, F.cross_entropy(logits, scored.y))
    on_device = build_objective(c, model, padded, torch.device("cpu"))
    total, count = on_device.loss(logits, (x, padded.y))
    assert int(count) == 4
    assert torch.allclose(total / count, F.cross_entropy(logits, padded.y, ignore_index=-100))


def test_a_dataset_whose_first_samples_are_unlabelled_is_checked_on_samples_across_it():
    # Its first batch has no targets (every label -100), its others do: it was refused.
    from refddp.config.schema import TrainConfig
    from refddp.workload.data import TensorPairDataset
    from refddp.workload.objectives import build_objective

    c = TrainConfig(input_dim=3, num_classes=4, batch_size=4)
    y = torch.randint(0, 4, (64,))
    y[:16] = -100  # the first 16 unlabelled (semi-supervised data, say)
    build_objective(c, nn.Linear(3, 4), TensorPairDataset(torch.randn(64, 3), y),
                    torch.device("cpu"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"^loss: no targets in the first batch nor in 8 "
                       r"samples spread over the dataset \(every label is -100\)"):
        build_objective(c, nn.Linear(3, 4), TensorPairDataset(torch.randn(64, 3),
                        torch.full((64,), -100)), torch.device("cpu"))  # fmt: skip


def config(**overrides):
    from refddp.config.schema import TrainConfig

    return TrainConfig(**{**sequence_code.GPT2_RUN, "dtype": "float32", **overrides})


def first_batch(c):
    from refddp.workload.objectives.batches import first_batch

    return first_batch(sequence_code.causal_sequences(c)[0], 6)


def checked(objective, model, batch):
    model.eval()
    with torch.no_grad():
        objective.check(model, batch)
    return objective


def test_an_hf_causal_lm_is_normalised_by_its_shifted_targets():
    pytest.importorskip("transformers")
    c = config()
    batch = first_batch(c)
    objective = checked(ModelLoss(), sequence_code.tiny_gpt2(c), batch)
    assert objective.exact and objective.shifts
    assert objective.count(batch) == int((batch["labels"][:, 1:] != -100).sum())


class SumsOverItsLabels(nn.Module):
    """Follows the num_items_in_batch convention without shifting (a masked-LM-like loss)."""

    def __init__(self):
        super().__init__()
        self.lm = sequence_code.TinyLM(12, 8)

    def forward(self, input_ids, attention_mask=None, labels=None, num_items_in_batch=None):
        logits = self.lm(input_ids)
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        count = (labels != -100).sum() if num_items_in_batch is None else num_items_in_batch
        return {"loss": total / count, "logits": logits}


def test_which_targets_a_model_counts_is_measured_not_assumed():
    c = config()
    batch = first_batch(c)
    objective = checked(ModelLoss(), SumsOverItsLabels(), batch)
    assert objective.exact and not objective.shifts
    mean_only = checked(ModelLoss(), sequence_code.MeanLossLM(12, 8), batch)
    assert not mean_only.exact
    assert "mean of micro-batch means" in mean_only.describe()


def test_a_user_loss_is_exact_only_when_it_returns_a_sum_and_a_count():
    c = config(model="tests.sequence_code:tiny_lm", data="tests.sequence_code:shifted_sequences")
    batch = first_batch(c)
    model = sequence_code.tiny_lm(c)
    assert checked(UserLoss("s", sequence_code.summed_token_loss), model, batch).exact
    mean = checked(UserLoss("m", sequence_code.mean_token_loss), model, batch)
    assert not mean.exact
    switching = UserLoss("s", sequence_code.mean_token_loss)
    switching.exact = True  # as if its first batch had returned (loss_sum, count)
    with pytest.raises(RuntimeError, match="returned \\(loss_sum, count\\) on one batch"):
        switching.loss(model(batch["input_ids"]), batch)


def _loss_per_position(outputs, batch):
    """(loss_sum, count) with every position counted, padding too: not refddp's count."""
    labels = batch["labels"]
    total = F.cross_entropy(outputs.flatten(0, 1), labels.flatten(), ignore_index=-100,
                            reduction="sum")  # fmt: skip
    return total, labels.numel()


def test_a_user_losss_count_must_be_the_one_counted_before_the_forward():
    # refddp counts each batch before its forward (labels other than -100), or by the loss's
    # own count(batch); a loss dividing by another count is refused on the first batch, in one
    # line, rather than silently normalised by a different count.
    c = config(model="tests.sequence_code:tiny_lm", data="tests.sequence_code:shifted_sequences")
    batch, model = first_batch(c), sequence_code.tiny_lm(c)
    spec = "tests.workload.test_objectives:_loss_per_position"
    with pytest.raises(ConfigError, match=r"^loss: .*:_loss_per_position returned a count of 60 "
                       r"for the first batch, but its targets other than -100 number \d+; .* give "
                       r"_loss_per_position a count\(batch\) attribute"):  # fmt: skip
        checked(UserLoss(spec, _loss_per_position), model, batch)
    _loss_per_position.count = lambda batch: batch["labels"].numel()
    try:
        objective = checked(UserLoss(spec, _loss_per_position), model, batch)
        assert objective.exact and objective.count(batch) == 60
    finally:
        del _loss_per_position.count


def test_user_metrics_must_be_numbers_summed_over_the_batch():
    metrics = UserMetrics("m", lambda outputs, batch: {"top1": [1, 2, 3]})
    with pytest.raises(ConfigError, match="metrics: m returned list of 3 for 'top1'"):
        metrics.check(None, None)
    ok = UserMetrics("m", lambda outputs, batch: {"hits": (3, 4), "seen": torch.tensor(4)})
    ok.check(None, None)
    assert ok.sum_names == ("metric:hits", "metric:hits:count", "metric:seen")
    sums = {"metric:hits": 6.0, "metric:hits:count": 8.0, "metric:seen": 8.0}
    assert ok.metrics(sums) == {"val_hits": 0.75, "val_seen": 8.0}
