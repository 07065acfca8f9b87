"""The two real workloads in examples/ train, small, with the README's commands."""

import json

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("transformers")


def last_record(run):
    return json.loads((run.out / "history.jsonl").read_text().splitlines()[-1])


@pytest.mark.slow  # a real workload: ~27 s
def test_the_digits_cnn_example_learns_scikit_learns_handwritten_digits(run_cli):
    done = run_cli("--config", "examples/digits_cnn.yaml", "--nproc", 2, epochs=3, device="cpu")
    record = last_record(done)
    assert record["val_acc"] > 0.85, record
    assert "val_perplexity" not in record  # one class per image: no perplexity
    assert record["targets_per_s"] == record["samples_per_s"]


@pytest.mark.slow  # a real workload: ~28 s
def test_the_gpt2_example_learns_byte_level_text_read_from_this_machine(run_cli):
    done = run_cli("--config", "examples/gpt2_bytes.yaml", "--nproc", 2, input_dim=32,
                   hidden_size=32, depth=2, train_size=640, val_size=64, epochs=1,
                   eval_every=5, warmup_steps=2, lr=3e-3, device="cpu")  # fmt: skip
    assert "normalised by the global batch's target count" in done.stderr
    history = [json.loads(line) for line in (done.out / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history] == [5, 10, 15, 20]
    # Uniform guessing over 256 bytes is perplexity 256; 20 small steps learn the common bytes.
    assert history[-1]["val_perplexity"] < min(128, history[0]["val_perplexity"]), history
    last = history[-1]
    assert last["targets_per_s"] > 5 * last["samples_per_s"]  # 8 to 32 tokens per sample
