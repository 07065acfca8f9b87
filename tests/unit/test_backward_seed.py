"""The gradient a training step's backward starts from: ``loss_scale``, made once per dtype
(``Trainer.backward_seed``), and made again if anything wrote into it."""

from types import SimpleNamespace

import torch

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
        loss.backward(Trainer.backward_seed(trainer, loss))
        grads.append(x.grad.tolist())
    assert grads == [[0.5] * 3] * 3
    # A seed nothing wrote into is kept; one per dtype and shape.
    seed = Trainer.backward_seed(trainer, torch.zeros(()))
    assert Trainer.backward_seed(trainer, torch.ones(())) is seed
    assert Trainer.backward_seed(trainer, torch.ones((), dtype=torch.float64)).dtype == torch.float64
    assert Trainer.backward_seed(trainer, torch.ones(1)).shape == (1,)
