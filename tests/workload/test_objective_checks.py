"""Bad input to the objective is found on a first batch before any step, on every rank alike:
one line naming what was found and what is expected, exit 2, no hang."""

import pytest

from refddp.testing import RankFailure
from tests.rank_tasks import fit
from tests.sequence_code import TOKEN_RUN

CASES = {
    "model-output-without-loss": (
        dict(TOKEN_RUN, model="tests.sequence_code:loss_free_lm", loss="model"),
        "loss: model: LossFree returned no loss (dict)",
    ),
    "outputs-that-do-not-fit-the-targets": (
        dict(model="tests.sequence_code:wrong_shape_model"),
        "loss: cross_entropy: the model's output (4, 3, 4) float64 does not fit the targets (4,) "
        "int64: it needs shape (4, 'classes')",
    ),
    "a-batch-with-no-targets": (
        dict(TOKEN_RUN, data="tests.sequence_code:no_target_sequences"),
        "loss: no targets in the first batch nor in 8 samples spread over the dataset "
        "(every label is -100)",
    ),
    "a-dict-batch-without-labels": (
        dict(TOKEN_RUN, data="tests.sequence_code:unlabelled_sequences"),
        "loss: cross_entropy needs the batch's targets, but this dict batch has no 'labels' "
        "(keys: input_ids, attention_mask)",
    ),
    "a-loss-callable-returning-a-vector": (
        dict(TOKEN_RUN, loss="tests.sequence_code:per_token_losses"),
        "loss: tests.sequence_code:per_token_losses must return a scalar tensor or "
        "(loss_sum, count), got Tensor of shape (4, 10)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_objective_input_stops_every_rank_before_any_step(spawn, tmp_path, case):
    flags, expected = CASES[case]
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), batch_size=4, **{k: v for k, v in flags.items()
                                                   if k != "global_batch_size"})  # fmt: skip
    assert set(info.value.failures) == {0, 1}
    for text in info.value.failures.values():
        assert f"ConfigError: {expected}" in text
    assert not (tmp_path / "checkpoints").exists()  # no step was taken


def test_a_problem_one_rank_alone_finds_stops_every_rank_with_its_line(spawn, tmp_path):
    flags = dict(TOKEN_RUN, data="tests.sequence_code:labels_missing_on_rank_1")
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), timeout=60, **flags)
    assert set(info.value.failures) == {0, 1}, "rank 0 must not go on alone (and hang)"
    for text in info.value.failures.values():
        assert "ConfigError: loss: cross_entropy needs the batch's targets" in text


def test_ranks_whose_losses_count_differently_stop_before_any_step(spawn, tmp_path):
    # Whether a step must agree on its target count decides whether it meets in the step's
    # all-reduce: rank 0 (one target a sample) would skip meetings rank 1 (-100 labels) makes.
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(tmp_path), timeout=60, data="tests.user_code:ignored_labels_on_rank_1")
    assert set(info.value.failures) == {0, 1}
    for text in info.value.failures.values():
        assert ("ConfigError: loss: the ranks' first batches make different objectives: rank(s) "
                "[0] count one target a sample") in text
    assert not (tmp_path / "checkpoints").exists()  # no step was taken


def test_bad_objective_input_through_the_cli_exits_2_with_one_line(run_cli):
    flags = {k: v for k, v in TOKEN_RUN.items() if k != "global_batch_size"}
    flags.update(model="tests.sequence_code:loss_free_lm", loss="model")
    done = run_cli("--nproc", 2, check=False, batch_size=4, **flags)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: loss: model: LossFree returned no loss (dict)")
    # Both ranks find it; the line names those that had exited with it when the launcher saw
    # the first one go (it then stops the others: on a loaded machine one may be stopped
    # before its own exit, and the line names only the other).
    assert last.endswith(("(ranks 0, 1)", "(rank 0)", "(rank 1)")), last
