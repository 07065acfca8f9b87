"""Rank-side tests: the body of a `multiproc` test runs on every rank."""

import pytest
import torch
import torch.distributed as dist


@pytest.mark.multiproc
def test_dist_ctx_describes_this_rank(dist_ctx):
    assert dist_ctx.rank == dist.get_rank()
    assert dist_ctx.world_size == dist.get_world_size() == 2
    assert dist_ctx.backend == "gloo" and dist_ctx.device == "cpu"


@pytest.mark.multiproc
@pytest.mark.world_size(2, 3)
def test_all_reduce_sums_over_every_rank(dist_ctx):
    t = torch.tensor([float(dist_ctx.rank + 1)])
    dist.all_reduce(t)
    n = dist_ctx.world_size
    assert t.item() == n * (n + 1) / 2


@pytest.mark.multiproc
def test_tmp_path_is_shared_by_every_rank(dist_ctx, tmp_path):
    (tmp_path / f"rank{dist_ctx.rank}").write_text("here")
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
