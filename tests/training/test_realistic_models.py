"""A model with batch norm and dropout, data augmented in loader workers, through the real CLI.

Which invariances hold for such a model (README, "Batch norm, dropout and augmentation"):
exact resume always; world-size invariance only with --sync-bn, grad_accum 1 and no dropout.
Each claim is tested on both sides: where it holds, and that it fails where the README says so.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import refddp

# Noise drawn from torch's RNG in each sample's __getitem__, which runs in the loader workers.
CONVNET = {"model": "convnet", "augment": 0.3, "num_workers": 2}


def assert_same_weights(a, b, rtol=0.0, atol=0.0):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


@pytest.mark.slow  # loader workers in three runs: ~55 s
def test_resume_mid_epoch_with_dropout_batchnorm_and_worker_augmentation_is_bit_identical(
    run_cli, tiny
):
    # Dropout masks come from each rank's restored RNG; augmentation from per-sample seeds that
    # do not depend on which worker or which invocation fetched the sample. Stopped in the
    # second epoch: the straight run's loader (made in epoch 0) must seed it as the resumed
    # run's new one does.
    flags = {**tiny, **CONVNET, "dropout": 0.2, "ckpt_every": 2}
    straight = run_cli("--nproc", 2, out="straight", **flags)
    stopped = run_cli("--nproc", 2, "--stop-after", 8, out="stopped", **flags)
    assert "stopped at step 8 (stop_after reached)" in stopped.stderr
    partial = stopped.checkpoint()  # 6 global batches of 16 per epoch: stopped mid-epoch 1
    assert (partial["epoch"], partial["step"], partial["samples_in_epoch"]) == (1, 8, 32)
    resumed = run_cli("--nproc", 2, out="stopped", **flags)
    assert "resumed from" in resumed.stderr and "at epoch 1, step 8" in resumed.stderr
    assert_same_weights(resumed.weights(), straight.weights())  # bit for bit, buffers included
    history = [(run.out / "history.jsonl").read_text() for run in (straight, resumed)]
    assert history[0].count("\n") == history[1].count("\n") == 2  # one evaluation per epoch
    assert resumed.checkpoint()["metrics"]["val_loss"] == straight.checkpoint()["metrics"][
        "val_loss"
    ]


# One global batch of 8 split over 1 or 2 ranks; no dropout: the invariant configuration.
INVARIANT = {"dropout": 0.0, "global_batch_size": 8, "epochs": 1}


@pytest.mark.slow  # eight runs: ~75 s
def test_batchnorm_model_is_world_size_invariant_only_with_sync_bn_no_accumulation_no_dropout(
    run_cli, tiny
):
    flags = {**tiny, **CONVNET, **INVARIANT, "sync_bn": True}
    one = run_cli("--nproc", 1, out="one", **flags).weights()
    two = run_cli("--nproc", 2, out="two", **flags).weights()
    # float64: only reduction order differs (measured <= 3e-16 absolute after 12 AdamW steps).
    assert_same_weights(two, one, rtol=1e-10, atol=1e-12)
    # Per-rank batch statistics, per-micro-batch statistics, per-rank dropout masks: each
    # breaks the invariance, as the README says. (One reference run for all: CLI runs are slow.)
    for change in ({"sync_bn": False}, {"grad_accum": 2}, {"dropout": 0.2}):
        other = run_cli("--nproc", 2, out=f"two-{[*change][0]}", **{**flags, **change}).weights()
        with pytest.raises(AssertionError):
            assert_same_weights(other, one, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # a CLI run: ~22 s
def test_a_batchnorm_checkpoint_evaluates_in_a_plain_loop_to_its_recorded_metric(run_cli, tiny):
    # Two ranks without --sync-bn: their batch norm statistics differ after training, so the
    # trainer must give every rank rank 0's before evaluating, or its metric is not the saved
    # model's. The plain side uses only public refddp functions and a default DataLoader.
    ckpt = run_cli("--nproc", 2, **{**tiny, **CONVNET, "epochs": 1}).checkpoint()
    model = refddp.build_model(ckpt["config"])
    model.load_state_dict(ckpt["model_state_dict"])
    model.eval()
    _, val = refddp.build_datasets(ckpt["config"])
    loss, correct = 0.0, 0
    with torch.no_grad():
        for x, y in DataLoader(val, batch_size=16):
            assert x.shape[1:] == (8,) and y.shape == x.shape[:1]
            logits = model(x)
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
    assert correct / len(val) == ckpt["metrics"]["val_acc"]
    assert loss / len(val) == pytest.approx(ckpt["metrics"]["val_loss"], rel=1e-12)


@pytest.mark.slow  # loader workers in three runs: ~30 s
def test_resume_at_an_epoch_boundary_repeats_augmentation_drawn_from_the_workers_seeds(
    run_cli, tiny
):
    # Augmentation from Python's and numpy's RNGs, which only the loader workers' seeds set
    # (tests/user_code.py): a run resumed at the start of epoch 2 draws what the straight run
    # drew there, the one loader it has used since epoch 0 seeded for the epoch as a new one is.
    flags = {
        **tiny,
        "epochs": 3,
        "num_workers": 2,
        "data": "tests.user_code:worker_random_datasets",
    }
    straight = run_cli("--nproc", 1, out="straight", **flags)
    stopped = run_cli("--nproc", 1, "--stop-after", 24, out="stopped", **flags)
    assert stopped.checkpoint()["step"] == 24  # 12 batches of 8 per epoch: two epochs done
    resumed = run_cli("--nproc", 1, out="stopped", **flags)
    assert "at epoch 2, step 24" in resumed.stderr
    assert_same_weights(resumed.weights(), straight.weights())


def test_a_dataset_drawing_from_python_and_numpy_in_the_process_trains_alike_in_every_fresh_run(
    run_cli, tiny
):
    # Noise from Python's `random` and numpy's global RNG, fetched in the rank's own process
    # (--num-workers 0): only the run's seeding of both at start makes two fresh runs equal.
    flags = {**tiny, "epochs": 1, "num_workers": 0, "data": "tests.user_code:worker_random_datasets"}
    first = run_cli("--nproc", 1, out="first", **flags)
    second = run_cli("--nproc", 1, out="second", **flags)
    assert_same_weights(first.weights(), second.weights())


def test_each_rank_draws_its_own_python_and_numpy_streams_the_same_in_every_fresh_run(
    run_cli, tiny, tmp_path
):
    # Seeded from --seed + the rank: ranks that drew one stream would add the same noise to
    # their different samples, and every fresh run must still draw what the last one did.
    draws = {}
    for run in ("first", "second"):
        folder = tmp_path / f"draws_{run}"
        folder.mkdir()
        run_cli("--nproc", 2, out=run, env={"REFDDP_TEST_DRAWS": str(folder)},
                **{**tiny, "epochs": 1, "data": "tests.user_code:host_draws_datasets"})  # fmt: skip
        draws[run] = [(folder / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert draws["first"][0] != draws["first"][1]
    assert draws["first"] == draws["second"]
