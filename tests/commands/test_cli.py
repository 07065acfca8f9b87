"""The real CLI, end to end, as a user runs it: `python -m refddp.train ...` in a subprocess."""

import json
import subprocess

import pytest
import torch
import yaml

import refddp
from refddp.launch.dist import loopback_store
from refddp.workload.objectives import PROBE_SAMPLES
from tests.cli_runs import run_nodes, torchrun_node_command


def assert_same_weights(a, b, rtol=0.0, atol=0.0):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


# (2 ranks, ~30 s on 2 cores: in make test-all)
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_train_eval_predict_end_to_end(run_cli, tiny, nproc):
    train = run_cli("--nproc", nproc, **tiny)
    expected_steps = 24 if nproc == 1 else 12  # 96 samples, 8 per rank, 2 epochs
    assert f"done: step {expected_steps}" in train.stderr
    out = train.out
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["batch_size"] == 8 and saved["dtype"] == "float64"
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2]
    for key in (
        "step",
        "train_loss",
        "val_loss",
        "val_acc",
        "samples_per_s",
        "data_wait_share",
        "peak_memory_mb",
    ):
        assert key in history[-1]
    ckpt = train.checkpoint()
    assert ckpt["world_size"] == nproc and ckpt["metrics"]["step"] == ckpt["step"]

    evaluated = run_cli("--task", "eval", "--nproc", nproc)
    metrics = json.loads((out / "eval.json").read_text())
    assert metrics["num_samples"] == 37
    assert metrics["val_acc"] == ckpt["metrics"]["val_acc"]
    assert "eval: val_loss" in evaluated.stderr

    run_cli("--task", "predict", "--nproc", nproc)
    predictions = torch.load(out / "predictions.pt", weights_only=True)
    assert predictions["index"].tolist() == list(range(37))
    model = refddp.build_model(ckpt["config"])
    model.load_state_dict(ckpt["model_state_dict"])
    val_x = refddp.build_datasets(ckpt["config"])[1].x
    torch.testing.assert_close(predictions["logits"], model(val_x).detach().float())
    assert torch.equal(predictions["prediction"], predictions["logits"].argmax(1))


def test_yaml_config_with_cli_override(run_cli, tiny, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({**tiny, "lr": 0.05, "epochs": 1}))
    run = run_cli("--config", config, "--lr", 0.02)
    saved = yaml.safe_load((run.out / "config.yaml").read_text())
    assert (saved["lr"], saved["epochs"], saved["hidden_size"]) == (0.02, 1, 16)


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_mixed_precision_trains_on_cpu(run_cli, tiny, amp):
    run = run_cli("--nproc", 2, **{**tiny, "dtype": "float32", "epochs": 1, "amp": amp})
    ckpt = run.checkpoint()
    assert ckpt["config"]["amp"] == amp
    assert all(torch.isfinite(v).all() for v in ckpt["model_state_dict"].values())
    if amp == "fp16":
        assert ckpt["scaler_state_dict"]["scale"] > 0


@pytest.mark.slow  # three CLI runs: ~23 s
def test_world_size_and_accumulation_split_give_the_same_weights(run_cli, tiny):
    flags = {**tiny, "global_batch_size": 8, "epochs": 2}
    one = run_cli("--nproc", 1, out="one", **flags).weights()
    two = run_cli("--nproc", 2, out="two", **flags).weights()
    two_by_two = run_cli("--nproc", 2, "--grad-accum", 2, out="accum", **flags).weights()
    # float64: only reduction order differs (measured ~1e-16 relative after 24 AdamW steps).
    assert_same_weights(two, one, rtol=1e-10, atol=1e-12)
    assert_same_weights(two_by_two, one, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # two whole CLI jobs: ~25 s
def test_invariance_check_detects_a_different_global_batch(run_cli, tiny):
    one = run_cli("--nproc", 1, out="one", **{**tiny, "global_batch_size": 8}).weights()
    other = run_cli("--nproc", 2, out="two", **tiny).weights()  # batch 8 per rank: global 16
    with pytest.raises(AssertionError):
        assert_same_weights(other, one, rtol=1e-10, atol=1e-12)


def test_ranks_see_disjoint_shards_that_cover_the_data_reshuffled_each_epoch(
    run_cli, tiny, tmp_path
):
    record = tmp_path / "seen"
    record.mkdir()
    run_cli(
        "--nproc",
        2,
        "--data",
        "tests.user_code:recording_datasets",
        env={"REFDDP_TEST_RECORD": str(record)},
        **tiny,  # 2 epochs, 6 global batches of 16 each
    )
    seen = [[int(i) for i in (record / f"rank{r}.txt").read_text().split()] for r in (0, 1)]
    # Before any step each rank checks the objective on the first samples (not trained on).
    probe = min(PROBE_SAMPLES, tiny["batch_size"])
    assert all(s[:probe] == list(range(probe)) for s in seen)
    seen = [s[probe:] for s in seen]
    assert len(seen[0]) == len(seen[1]) == 2 * 48
    for epoch in (0, 1):
        mine = [s[epoch * 48 : (epoch + 1) * 48] for s in seen]
        assert set(mine[0]).isdisjoint(mine[1])
        assert set(mine[0]) | set(mine[1]) == set(range(96))
    assert seen[0][:48] != seen[0][48:], "the second epoch must be a new shuffle"


@pytest.mark.slow  # two torchrun agents and their job: ~22 s
def test_two_nodes_with_plain_torchrun_on_loopback(tmp_path, tiny, spawn):
    # The rendezvous store is held here, as a cluster's external store would be, and both
    # torchrun "nodes" join it as clients: a port probed now and bound by torchrun later can be
    # taken in between by any other socket on the machine, and then both nodes hang.
    rendezvous = loopback_store()
    out = tmp_path / "two-nodes"
    command = torchrun_node_command(rendezvous.port, 2, out, **tiny)
    try:
        nodes = run_nodes([command, command])
    except subprocess.TimeoutExpired as exc:  # the logs are the diagnosis
        pytest.fail(f"two-node job hung:\n{exc.output}")
    assert [code for code, _ in nodes] == [0, 0], "\n".join(log for _, log in nodes)
    ckpt = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert ckpt["world_size"] == 2 and ckpt["step"] == 12
