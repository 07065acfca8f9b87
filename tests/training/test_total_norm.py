"""``refddp.training.parallel.total_norm``: the gradient's norm that decides whether a step is applied,
computed as ``clip_grad_norm_`` computes it, on a torch with ``nn.utils.get_total_norm`` and on
one without (torch < 2.6), where a norm of the per-tensor norms stands in; on the CPU that norm
of norms is used always, and gives get_total_norm's bits."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
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


SPECIAL = st.sampled_from([0.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan")])


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from(DTYPES), sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
       mixed=st.none() | st.lists(st.sampled_from(DTYPES), min_size=40, max_size=40),
       seed=st.integers(0, 2**16), special=st.none() | st.tuples(st.integers(0, 39), SPECIAL))  # fmt: skip
def test_on_the_cpu_the_norm_of_norms_has_get_total_norms_bits(dtype, sizes, mixed, seed,
                                                               special):  # fmt: skip
    # One dtype (a model's usual gradients), or a dtype per tensor (get_total_norm groups
    # them by dtype, which reorders the norms: those go through it).
    if not hasattr(nn.utils, "get_total_norm"):
        pytest.skip("torch < 2.6 has no get_total_norm to compare with")
    generator = torch.Generator().manual_seed(seed)
    dtypes = mixed or [dtype] * len(sizes)
    grads = [torch.randn(n, generator=generator).to(dtypes[i]) for i, n in enumerate(sizes)]
    if special is not None:
        at, value = special
        grads[at % len(grads)][0] = value
    ours, torchs = parallel.total_norm(grads), nn.utils.get_total_norm(grads)
    assert ours.dtype == torchs.dtype
    assert torch.equal(ours, torchs) or (ours.isnan() and torchs.isnan()), (ours, torchs)
