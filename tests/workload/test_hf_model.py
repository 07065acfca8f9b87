"""A real library's model through the trainer: a Hugging Face GPT-2 (random init from a config,
nothing downloaded) with dict batches and its own loss keeps every guarantee: exact mid-epoch
resume in both checkpoint formats, resume at another world size, FSDP over its blocks, and
checkpoints with clean keys that the bare HF model loads strictly and evaluates."""

import json

import pytest
import torch

from refddp.workload.data import build_datasets
from refddp.workload.models import build_model
from tests.rank_tasks import (
    autocast_dtypes_seen,
    fit,
    fit_full_weights,
    fit_seeded,
    tiny_config,
)
from tests.sequence_code import GPT2_RUN
from tests.torch_features import FSDP, needs_fsdp2

pytest.importorskip("transformers")

ADAMW = dict(GPT2_RUN, optimizer="adamw", lr=1e-2, epochs=2, dropout=0.1)


def assert_bit_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("ckpt_format", ["full", "dcp"])
def test_gpt2_with_dropout_resumes_mid_epoch_bit_identically(spawn, tmp_path, ckpt_format):
    flags = dict(ADAMW, ckpt_format=ckpt_format)
    straight = spawn(fit_seeded, str(tmp_path / "straight"), **flags)[0]
    spawn(fit_seeded, str(tmp_path / "resumed"), stop_after=5, **flags)  # 8 steps per epoch
    resumed = spawn(fit_seeded, str(tmp_path / "resumed"), **flags)[0]
    assert resumed["step"] == straight["step"] == 16
    assert_bit_identical(resumed["weights"], straight["weights"])


@pytest.mark.slow  # three GPT-2 runs: ~23 s
def test_gpt2_resumed_at_another_world_size_continues_the_same_run(spawn, tmp_path):
    flags = dict(GPT2_RUN, epochs=2)
    straight = spawn(fit, str(tmp_path / "straight"), world_size=1, **flags)[0]
    spawn(fit, str(tmp_path / "hopping"), world_size=2, stop_after=5, **flags)
    last = spawn(fit, str(tmp_path / "hopping"), world_size=3, **flags)[0]
    assert last["step"] == straight["step"] == 16
    for key, value in straight["weights"].items():  # float32 loss: equal to its rounding
        torch.testing.assert_close(last["weights"][key], value, rtol=2e-5, atol=2e-6, msg=key)


@pytest.mark.parametrize("amp, half", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_gpt2_trains_with_its_forward_in_half_precision(spawn, tmp_path, amp, half):
    flags = dict(GPT2_RUN, dtype="float32", amp=amp, max_steps=3)
    seen = spawn(autocast_dtypes_seen, str(tmp_path), **flags)
    assert seen == [{half}, {half}]  # the LM head computed in half precision: not a no-op
    record = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 3
    assert torch.isfinite(torch.tensor([record["train_loss"], record["val_loss"]])).all()


def fsdp_units(out: str, **overrides) -> list[str]:
    """The classes of the modules the trainer made FSDP units of."""
    from torch.distributed.fsdp import FSDPModule

    from refddp.launch.dist import init_distributed
    from refddp.training.trainer import Trainer

    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    units = [m for m in trainer.model.modules() if isinstance(m, FSDPModule)]
    return [type(m).__name__.removeprefix("FSDP") for m in units]  # FSDP2 renames the class


@needs_fsdp2
def test_fsdp_shards_gpt2_by_the_blocks_it_names_and_trains_as_ddp_does(spawn, tmp_path):
    units = spawn(fsdp_units, str(tmp_path / "units"), strategy="fsdp", **GPT2_RUN)[0]
    assert units == ["GPT2LMHeadModel", "GPT2Block", "GPT2Block"]  # the root, its 2 blocks
    ddp = spawn(fit_full_weights, str(tmp_path / "ddp"), **GPT2_RUN)[0]
    fsdp = spawn(fit_full_weights, str(tmp_path / "fsdp"), strategy="fsdp", **GPT2_RUN)[0]
    for key, value in ddp["weights"].items():
        torch.testing.assert_close(fsdp["weights"][key], value, rtol=2e-5, atol=2e-6, msg=key)


@pytest.mark.parametrize("strategy", ["ddp", FSDP])
def test_a_gpt2_checkpoint_loads_strictly_into_the_bare_hf_model_and_evaluates_to_its_metric(
    spawn, tmp_path, strategy
):
    from transformers import GPT2LMHeadModel

    spawn(fit, str(tmp_path), strategy=strategy, **GPT2_RUN)
    ckpt = torch.load(tmp_path / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt["model_state_dict"])
    hf = GPT2LMHeadModel(build_model(ckpt["config"]).config)  # HF's class, not refddp's builder
    hf.load_state_dict(ckpt["model_state_dict"], strict=True)
    _, val = build_datasets(ckpt["config"])
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(val, batch_size=7):
            targets = int((batch["labels"][:, 1:] != -100).sum())
            total += hf(**batch).loss.item() * targets  # HF's mean over its shifted targets
            count += targets
    recorded = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])
    assert abs(total / count - recorded["val_loss"]) < 1e-5 * recorded["val_loss"]


@pytest.mark.slow  # transformers in every rank, CLI runs: ~50 s
def test_predict_writes_gpt2_logits_for_every_sample_in_dataset_order(run_cli, tmp_path):
    flags = {k: v for k, v in GPT2_RUN.items() if k != "global_batch_size"}
    run_cli("--nproc", 2, "--batch-size", 6, **flags)
    run_cli("--nproc", 3, "--task", "predict", "--batch-size", 5, **flags)
    predictions = torch.load(tmp_path / "run" / "predictions.pt", weights_only=True)
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "checkpoint_latest.pth",
                      weights_only=True)  # fmt: skip
    model = build_model(ckpt["config"])
    model.load_state_dict(ckpt["model_state_dict"])
    _, val = build_datasets(ckpt["config"])
    batch = torch.utils.data.default_collate([val[i] for i in range(len(val))])
    with torch.no_grad():
        logits = model(**batch).logits
    assert predictions["index"].tolist() == list(range(len(val)))
    torch.testing.assert_close(predictions["logits"], logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(predictions["prediction"], predictions["logits"].argmax(-1))


def fit_compiling_every_block(out: str, **overrides) -> list[int]:
    """Train with --compile under FSDP; dynamo must compile every unit's forward without
    reaching its recompile limit (past it, a frame silently runs eagerly: made an error here).
    Dynamo's eager backend: what is traced and cached is the same as with inductor, in a
    fraction of the time. Returns, per unit, the graphs dynamo holds for its forward."""
    import functools

    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from refddp.launch.dist import init_distributed
    from refddp.training.trainer import Trainer

    torch._dynamo.reset()
    compile_ = torch.compile
    torch.compile = functools.partial(compile_, backend="eager")
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
            trainer.fit()
    finally:
        torch.compile = compile_
    compiled = [getattr(m.forward, "_torchdynamo_orig_callable", None)
                for m in trainer.model.modules()]  # fmt: skip
    return [len(_debug_get_cache_entry_list(f.__code__)) for f in compiled if f is not None]


@pytest.mark.slow  # inductor compiles twelve blocks: ~45 s
@pytest.mark.heavy
@needs_fsdp2
def test_compile_under_fsdp_compiles_every_one_of_twelve_blocks(spawn, tmp_path):
    flags = dict(GPT2_RUN, depth=12, strategy="fsdp", compile=True, max_steps=2)
    for graphs in spawn(fit_compiling_every_block, str(tmp_path), timeout=300, **flags):
        assert len(graphs) == 12  # the GPT2Blocks (the root's own layers stay eager)
        assert all(graphs), f"blocks that ran without a compiled graph: {graphs}"
