"""The trainer leaves the user's model alone, so ordinary PyTorch DDP idioms work on it: DDP's
``.module`` is the user's model (no parameter, buffer or hook added), clipping over the DDP
module's parameters is clipping over the model's, the DDP state dict has the usual
``module.`` keys, a comm hook the user registers is the only one and the normalisation is
unchanged under it, and gradient checkpointing trains as without it."""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import default_collate

from refddp.launch.dist import init_distributed
from refddp.training.trainer import Trainer
from refddp.workload.data import build_datasets
from refddp.workload.models import build_model
from tests.rank_tasks import fit, state_of, tiny_config
from tests.sequence_code import GLOBAL_BATCH, TOKEN_RUN


def _hooks(model: torch.nn.Module) -> list[int]:
    """How many hooks of each kind the model's modules and parameters hold (private attributes:
    torch has no public way to list hooks)."""
    counts = []
    for module in model.modules():
        counts += [len(module._forward_hooks), len(module._forward_pre_hooks),
                   len(module._backward_hooks), len(module._backward_pre_hooks)]  # fmt: skip
    for p in model.parameters():
        counts += [len(p._backward_hooks or {}), len(p._post_accumulate_grad_hooks or {})]
    return counts


def ddp_module_seen_as_plain_pytorch(out: str) -> dict:
    c = tiny_config(out, model="convnet")  # BatchNorm: buffers too
    trainer = Trainer(c, init_distributed("cpu"))
    wrapped, model = trainer.parallel.wrapped, trainer.model
    torch.manual_seed(0)
    plain = DDP(build_model(c))  # what a hand-written DDP loop holds
    batch = next(trainer.epoch_batches())
    trainer.objective.batch_loss(trainer.forward, batch).total.backward()  # DDP syncs
    norms = [torch.nn.utils.clip_grad_norm_(wrapped.parameters(), float("inf")),
             torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))]  # fmt: skip
    torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1e-3)
    norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    state = wrapped.state_dict()
    bare = build_model(c)
    bare.load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=True)
    return {
        "module_is_model": wrapped.module is model,
        "parameters": [p is q for p, q in zip(wrapped.parameters(), model.parameters(),
                                              strict=True)],  # fmt: skip
        "counts": (len(list(wrapped.parameters())), len(list(plain.parameters())),
                   len(list(wrapped.buffers())), len(list(plain.buffers()))),  # fmt: skip
        "hooks": (_hooks(model), _hooks(plain.module)),
        "norms": [float(n) for n in norms],
        "keys": (sorted(state), sorted("module." + k for k in model.state_dict())),
    }


def test_ddps_module_is_the_users_model_and_plain_pytorch_idioms_see_only_it(spawn, tmp_path):
    for rank in spawn(ddp_module_seen_as_plain_pytorch, str(tmp_path)):
        assert rank["module_is_model"] and all(rank["parameters"]), rank
        assert rank["counts"][0] == rank["counts"][1] and rank["counts"][2] == rank["counts"][3]
        assert rank["hooks"][0] == rank["hooks"][1], "refddp adds no hook to the model"
        # The norm over the DDP module's parameters is the model's (no parameter of refddp's
        # in it), and clipping over them clips the model's gradient to the bound.
        via_ddp, via_model, after_clipping = rank["norms"]
        assert via_ddp == via_model > 1e-3
        assert after_clipping == pytest.approx(1e-3, rel=1e-3)
        assert rank["keys"][0] == rank["keys"][1], "the usual module. keys, nothing more"


def fit_under_fp16_compress_hook(out: str, **overrides) -> dict:
    """``fit`` with the user's fp16_compress_hook registered on DDP: the target counts the
    steps agreed, and the weights."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    trainer.parallel.wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    counts, read = [], trainer.agreement.read

    def recording(*args):
        found = read(*args)
        if found.targets:  # (a settle before an evaluation or a save agrees no count)
            counts.append(found.targets)
        return found

    trainer.agreement.read = recording
    trainer.fit()
    return {"counts": counts, "weights": state_of(trainer.model)}


def test_under_a_users_fp16_compress_hook_a_step_is_still_the_mean_over_every_target(
    spawn, tmp_path
):
    # The hook compresses DDP's gradient all-reduce to fp16; the normalisation (the count,
    # agreed apart, in float64, and the loss's scale) must not change: one step on padded
    # sequences, 2 ranks x 3 micro-batches, is the same step by hand, in one process, to fp16's
    # rounding. Normalised per rank or micro-batch it would be off by far more: the
    # micro-batches' target counts differ by 2x and more.
    found = spawn(fit_under_fp16_compress_hook, str(tmp_path), grad_accum=3, max_steps=1,
                  **TOKEN_RUN)[0]  # fmt: skip
    c = tiny_config("unused", **TOKEN_RUN)
    model = build_model(c)
    train, _ = build_datasets(c)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(c.seed))
    batch = default_collate([train[i] for i in order[:GLOBAL_BATCH].tolist()])
    assert found["counts"] == [float((batch["labels"] != -100).sum())], "exact"
    logits = model(batch["input_ids"])
    F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100).backward()
    for name, p in model.named_parameters():
        moved = found["weights"][name] - p.detach()
        torch.testing.assert_close(moved, -c.lr * p.grad, rtol=5e-3, atol=1e-6, msg=name)


def test_gradient_checkpointing_trains_as_one_process_does(spawn, tmp_path):
    job = dict(model="tests.user_code:checkpointed_mlp", global_batch_size=8, epochs=1)
    one = spawn(fit, str(tmp_path / "one"), world_size=1, **job)[0]
    two = spawn(fit, str(tmp_path / "two"), world_size=2, **job)
    assert one["step"] == two[0]["step"] == 12
    for key, value in one["weights"].items():
        torch.testing.assert_close(two[0]["weights"][key], value, rtol=1e-9, atol=1e-12)
        assert torch.equal(two[0]["weights"][key], two[1]["weights"][key])
