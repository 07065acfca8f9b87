"""The gradient a training step's backward starts from: ``loss_scale``, made once per dtype
(``Trainer.backward_seed``), and made again if anything wrote into it; and the call that runs
the backward from it (``run_backward``)."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from refddp.parallel import run_backward
from refddp.trainer import Trainer


class _DoublesItsGradOutput(torch.autograd.Function):
    """A loss whose backward scales its ``grad_output`` in place (allowed, if unwise)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad.mul_(2)
        return grad.expand(3)


def test_a_seed_written_into_by_a_backward_is_made_again():
    trainer = SimpleNamespace(seeds={}, loss_scale=0.25, scaling=False)  # no fp16 scaler
    grads = []
    for _ in range(3):  # three steps: each must start from 0.25
        x = torch.zeros(3, requires_grad=True)
        loss = _DoublesItsGradOutput.apply(x)
        run_backward(loss, Trainer.backward_seed(trainer, loss))
        grads.append(x.grad.tolist())
    assert grads == [[0.5] * 3] * 3
    # A seed nothing wrote into is kept; one per dtype and shape.
    seed = Trainer.backward_seed(trainer, torch.zeros(()))
    assert Trainer.backward_seed(trainer, torch.ones(())) is seed
    assert Trainer.backward_seed(trainer, torch.ones((), dtype=torch.float64)).dtype == torch.float64
    assert Trainer.backward_seed(trainer, torch.ones(1)).shape == (1,)


class _SeesBackward(TorchFunctionMode):
    """Records the torch functions dispatched under it, as a tensor subclass's would be."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _grads(backward) -> list[list[float]]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    hooked = []
    model[0].weight.register_hook(lambda g: hooked.append(g.clone()))
    loss = model(torch.randn(5, 4)).square().sum()
    backward(loss, torch.full_like(loss, 0.25))
    assert len(hooked) == 1  # the parameters' hooks ran
    return [p.grad.flatten().tolist() for p in model.parameters()]


def test_run_backward_gives_what_tensor_backward_gives_and_leaves_dispatch_to_torch():
    assert _grads(run_backward) == _grads(lambda loss, seed: loss.backward(seed))
    # Under a torch-function mode (or with a tensor subclass) the backward is dispatched
    # through it, as torch's own call does.
    with _SeesBackward() as mode:
        _grads(run_backward)
    assert "backward" in mode.seen


def test_run_backward_frees_the_graph_and_leaves_functorch_transforms_to_torch():
    x = torch.ones(3, requires_grad=True)
    loss = (x * x).sum()
    run_backward(loss, torch.ones(()))
    with pytest.raises(RuntimeError, match="a second time"):  # retain_graph=False, as torch's
        run_backward(loss, torch.ones(()))

    def inside_a_transform(y: torch.Tensor) -> torch.Tensor:
        run_backward((y * y).sum(), torch.ones(()))
        return y.sum()

    with pytest.raises(RuntimeError, match="functorch transform"):  # torch's own refusal
        torch.func.grad(inside_a_transform)(torch.ones(3))


def test_run_backward_gives_a_second_root_its_gradient_whichever_way_it_enters():
    # Parallel.backward hands the step flags to DDP as the carrier parameter's gradient.
    for dispatched in (False, True):
        carrier = torch.zeros(3, requires_grad=True)
        x = torch.ones(2, requires_grad=True)
        flags = torch.tensor([1.0, 2.0, 3.0])
        mode = _SeesBackward()
        with mode if dispatched else contextlib.nullcontext():
            run_backward((x * x).sum(), torch.ones(()), carrier, flags)
        assert carrier.grad.tolist() == [1.0, 2.0, 3.0] and x.grad.tolist() == [2.0, 2.0]
        assert ("backward" in mode.seen) == dispatched
