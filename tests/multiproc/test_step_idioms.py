"""The trainer leaves the user's model alone, so ordinary PyTorch DDP idioms work on it: DDP's
``.module`` is the user's model (no parameter, buffer or hook added), clipping over the DDP
module's parameters is clipping over the model's, the DDP state dict has the usual
``module.`` keys, a comm hook the user registers is the only one and the agreed target counts
stay exact under it, and gradient checkpointing trains as without it."""

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from refddp.data import build_datasets
from refddp.dist import init_distributed
from refddp.models import build_model
from refddp.trainer import Trainer
from tests.rank_tasks import fit, tiny_config
from tests.sequence_code import TOKEN_RUN


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


def fit_recording_agreed_counts(out: str, compress: bool, **overrides) -> dict:
    """``fit`` with (``compress``) the user's fp16_compress_hook on DDP: the target counts and
    loss sums every step's agreement read."""
    trainer = Trainer(tiny_config(out, **overrides), init_distributed("cpu"))
    if compress:
        trainer.parallel.wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    agreed, read = [], trainer.agreement.read

    def recording(*args):
        found = read(*args)
        if found.targets:  # (a settle before an evaluation or a save agrees no count)
            agreed.append(found)
        return found

    trainer.agreement.read = recording
    trainer.fit()
    return {"counts": [a.targets for a in agreed], "first_loss": agreed[1].previous_loss_sum}


def test_a_users_fp16_compress_hook_leaves_the_agreed_target_counts_exact(spawn, tmp_path):
    job = {k: v for k, v in TOKEN_RUN.items()}  # padded sequences: counts vary per step
    plain = spawn(fit_recording_agreed_counts, str(tmp_path / "plain"), False, **job)[0]
    hooked = spawn(fit_recording_agreed_counts, str(tmp_path / "hooked"), True, **job)[0]
    train, _ = build_datasets(tiny_config("unused", **job))
    every_target = sum(int((train[i]["labels"] != -100).sum()) for i in range(len(train)))
    # One epoch sees every sample once: the steps' counts add up to every target, exactly.
    assert len(hooked["counts"]) == 8 and sum(hooked["counts"]) == every_target
    assert hooked["counts"] == plain["counts"] and len(set(plain["counts"])) > 1
    assert hooked["first_loss"] == plain["first_loss"], "step 1: same weights, same loss sum"


def test_gradient_checkpointing_trains_as_one_process_does(spawn, tmp_path):
    job = dict(model="tests.user_code:checkpointed_mlp", global_batch_size=8, epochs=1)
    one = spawn(fit, str(tmp_path / "one"), world_size=1, **job)[0]
    two = spawn(fit, str(tmp_path / "two"), world_size=2, **job)
    assert one["step"] == two[0]["step"] == 12
    for key, value in one["weights"].items():
        torch.testing.assert_close(two[0]["weights"][key], value, rtol=1e-9, atol=1e-12)
        assert torch.equal(two[0]["weights"][key], two[1]["weights"][key])
