"""``refddp.training.parallel.total_norm``: the gradient's norm that decides whether a step is applied,
computed as ``clip_grad_norm_`` computes it, on a torch with ``nn.utils.get_total_norm`` and on
one without (torch < 2.6), where a norm of the per-tensor norms stands in."""

import pytest
import torch
from torch import nn

from refddp.training import parallel


@pytest.mark.parametrize("has_get_total_norm", [True, False])
def test_the_total_norm_is_clippings_with_or_without_get_total_norm(
    monkeypatch, has_get_total_norm
):
    grads = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)]
    if not has_get_total_norm:
        monkeypatch.delattr(nn.utils, "get_total_norm", raising=False)
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    expected = nn.utils.clip_grad_norm_(params, float("inf"))
    assert parallel.total_norm(grads).item() == pytest.approx(expected.item(), rel=1e-12)
    grads[1][0] = float("nan")
    assert torch.isnan(parallel.total_norm(grads))
    assert parallel.total_norm([]).item() == 0.0
