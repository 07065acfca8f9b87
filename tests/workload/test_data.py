"""Datasets and shards: every sample once, the same step count on every rank, exact resume."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from refddp.config.schema import ConfigError, TrainConfig
from refddp.workload.data import GlobalBatchSampler, ShardSampler, build_datasets, make_loader


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 8),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 5),
)
def test_distributed_sampler_shards_are_equal_disjoint_and_cover(
    n, world, shuffle, drop_last, seed, epoch
):
    shards = []
    for rank in range(world):
        s = DistributedSampler(
            Sized(n), world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        shards.append(list(s))
    assert len({len(s) for s in shards}) == 1, "every rank must get the same number of samples"
    flat = [i for s in shards for i in s]
    if drop_last or n % world == 0:
        assert len(flat) == len(set(flat)), "shards overlap"
    if not drop_last:
        assert set(flat) == set(range(n)), "shards do not cover the data"
    else:
        assert len(flat) == n - n % world


@settings(max_examples=50, deadline=None)
@given(n=st.integers(8, 300), world=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_global_batch_sampler_reshuffles_every_epoch(n, world, seed):
    s = GlobalBatchSampler(Sized(n), world, 0, world * 2, seed)
    orders = []
    for epoch in range(4):
        s.set_epoch(epoch)
        orders.append(list(s))
    assert len({tuple(o) for o in orders}) > 1


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    world=st.integers(1, 6),
    batch=st.integers(1, 9),
    accum=st.integers(1, 3),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
)
def test_global_batches_are_the_same_for_every_split(n, world, batch, accum, seed, epoch):
    """Global step k trains on the same samples however they are split over ranks."""
    g = world * batch * accum
    if n < g:
        return
    reference = GlobalBatchSampler(Sized(n), 1, 0, g, seed)
    reference.set_epoch(epoch)
    ref = list(reference)
    shards = []
    for rank in range(world):
        s = GlobalBatchSampler(Sized(n), world, rank, g, seed)
        s.set_epoch(epoch)
        shards.append(list(s))
    assert len({len(s) for s in shards}) == 1
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == (n // g) * g, "disjoint, whole global batches only"
    for step in range(n // g):
        per_rank = [s[step * batch * accum : (step + 1) * batch * accum] for s in shards]
        assert sorted(i for p in per_rank for i in p) == sorted(ref[step * g : (step + 1) * g])


@settings(max_examples=100, deadline=None)
@given(n=st.integers(8, 300), world=st.integers(1, 4), done=st.integers(0, 20))
def test_resuming_mid_epoch_continues_the_same_order(n, world, done):
    g = 2 * world
    steps = n // g
    done = min(done, steps)
    full = [GlobalBatchSampler(Sized(n), world, r, g, 3) for r in range(world)]
    resumed = [GlobalBatchSampler(Sized(n), world, r, g, 3) for r in range(world)]
    for s in resumed:
        s.set_start(done * g)
    for f, r in zip(full, resumed, strict=True):
        assert list(f)[done * 2 :] == list(r)
        assert len(r) == len(list(r))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 100), world=st.integers(1, 7))
def test_eval_shards_see_every_sample_exactly_once(n, world):
    flat = [i for r in range(world) for i in ShardSampler(n, world, r)]
    assert sorted(flat) == list(range(n))


def test_synthetic_data_is_a_pure_function_of_the_seed():
    a_train, a_val = build_datasets(TrainConfig(train_size=64, val_size=16, seed=5))
    b_train, _ = build_datasets(TrainConfig(train_size=64, val_size=16, seed=5))
    c_train, _ = build_datasets(TrainConfig(train_size=64, val_size=16, seed=6))
    assert torch.equal(a_train.x, b_train.x) and torch.equal(a_train.y, b_train.y)
    assert not torch.equal(a_train.x, c_train.x)
    assert len(a_val) == 16 and len(set(a_train.y.tolist())) > 1, "labels must vary"


def test_loader_batches_match_item_access():
    train, _ = build_datasets(TrainConfig(train_size=40, val_size=8))
    c = TrainConfig(train_size=40, val_size=8)
    x, y = next(iter(make_loader(train, ShardSampler(40, 1, 0), 5, c, False, 0)))
    assert torch.equal(x, torch.stack([train[i][0] for i in range(5)]))
    assert torch.equal(y, torch.stack([train[i][1] for i in range(5)]))


def test_built_datasets_work_with_a_plain_dataloader_and_default_collation():
    c = TrainConfig(train_size=40, val_size=37, input_dim=8, augment=0.1)
    train, val = build_datasets(c)
    for dataset in (train, val):
        batches = list(DataLoader(dataset, batch_size=16))
        assert [tuple(x.shape) for x, _ in batches] == [(16, 8), (16, 8), (len(dataset) - 32, 8)]
        assert all(y.shape == x.shape[:1] and y.dtype == torch.int64 for x, y in batches)
    x, y = next(iter(DataLoader(val, batch_size=16)))
    assert torch.equal(x, val.x[:16]) and torch.equal(y, val.y[:16]), "no noise on validation"


def fetched(c, epoch, num_workers, split=1, loader_seed=0):
    """Every training sample as refddp's loader serves it in ``epoch`` (index order)."""
    train, _ = build_datasets(c)
    c = TrainConfig(**{**c.to_dict(), "num_workers": num_workers})
    samplers = []
    for rank in range(split):
        s = GlobalBatchSampler(train, split, rank, len(train), c.seed)
        s.set_epoch(epoch)
        samplers.append(s)
    out = torch.empty_like(train.x)
    for s in samplers:
        loader = make_loader(train, s, 4, c, False, loader_seed + 1000 * split)
        for index, (x, _) in zip(torch.tensor(list(s)).split(4), loader, strict=True):
            out[index] = x
    return out


def test_augmentation_depends_only_on_seed_epoch_and_sample():
    # Noise is drawn from torch's RNG in __getitem__ (in the workers when num_workers > 0):
    # refddp seeds each sample's fetch, so neither the worker, the rank split, the loader seed
    # nor a resume changes it, and the caller's RNG is left where it was.
    c = TrainConfig(train_size=24, val_size=4, input_dim=3, augment=0.5, dtype="float64")
    clean = build_datasets(c)[0].x
    caller = torch.get_rng_state()
    in_process = fetched(c, epoch=1, num_workers=0)
    assert torch.equal(torch.get_rng_state(), caller)
    assert not torch.equal(in_process, clean)
    assert (in_process - clean).std().item() == pytest.approx(0.5, rel=0.3)
    assert torch.equal(fetched(c, epoch=1, num_workers=2, loader_seed=7), in_process)
    assert torch.equal(fetched(c, epoch=1, num_workers=2, split=3), in_process)
    assert not torch.equal(fetched(c, epoch=2, num_workers=0), in_process), "new noise per epoch"


def save(path, **tensors):
    torch.save(tensors, path)
    return str(path)


def test_tensor_file_with_x_and_y_splits_off_validation(tmp_path):
    path = save(tmp_path / "d.pt", x=torch.randn(50, 4), y=torch.randint(0, 3, (50,)))
    train, val = build_datasets(TrainConfig(data=path, input_dim=4, num_classes=3))
    assert (len(train), len(val)) == (45, 5)


@pytest.mark.parametrize(
    "tensors, message",
    [
        (
            {"x": torch.randn(10, 5), "y": torch.zeros(10, dtype=torch.int64)},
            r"shape \(N, input_dim=4\), got float32 \(\d+, 5\)",
        ),
        (
            {"x": torch.randn(10, 4), "y": torch.zeros(10)},
            r"y in .* must be an int64 tensor .* got float32",
        ),
        (
            {"x": torch.randn(10, 4), "y": torch.full((10,), 7)},
            r"labels in y of .* must lie in \[0, num_classes=4\) or be -100 \(ignored\), found 7..7",
        ),
        ({"inputs": torch.randn(10, 4)}, r"must hold keys x, y .*; found inputs"),
        (  # the file's own shape and names, not those of the split made from it
            {"x": torch.randn(10, 4), "y": torch.zeros(9, dtype=torch.int64)},
            r"y in .* must be an int64 tensor of shape \(10,\) \(one label for each row of x\), "
            r"got int64 \(9,\)$",
        ),
        (
            {"train_x": torch.randn(10, 4), "train_y": torch.zeros(10, dtype=torch.int64),
             "val_x": torch.randn(3, 5), "val_y": torch.zeros(3, dtype=torch.int64)},
            r"val_x in .* must be a float tensor of shape \(N, input_dim=4\), got float32 \(3, 5\)$",
        ),
        (
            {"train_x": torch.randn(10, 4), "train_y": torch.tensor([-100] * 9 + [-1]),
             "val_x": torch.randn(3, 4), "val_y": torch.zeros(3, dtype=torch.int64)},
            r"labels in train_y of .* must lie in \[0, num_classes=4\) or be -100 \(ignored\), "
            r"found -1..-1$",
        ),
    ],
)
def test_tensor_file_with_wrong_shapes_or_dtypes_is_named(tmp_path, tensors, message):
    path = save(tmp_path / "bad.pt", **tensors)
    with pytest.raises(ConfigError, match=r"^data: .*" + message):
        build_datasets(TrainConfig(data=path, input_dim=4, num_classes=4))


def test_tensor_file_labels_may_be_the_ignored_index(tmp_path):
    y = torch.randint(0, 3, (50,))
    y[::7] = -100  # padding a user marked as the loss's ignore index
    path = save(tmp_path / "d.pt", x=torch.randn(50, 4), y=y)
    train, val = build_datasets(TrainConfig(data=path, input_dim=4, num_classes=3))
    assert torch.equal(torch.cat([train.y, val.y]), y)


def test_missing_or_unreadable_data_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"^data: file not found: .*nope.pt$"):
        build_datasets(TrainConfig(data=str(tmp_path / "nope.pt")))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a tensor file")
    with pytest.raises(ConfigError, match=r"^data: cannot read .*junk.pt"):
        build_datasets(TrainConfig(data=str(junk)))


def test_user_data_callable_must_import(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^data: cannot import module 'no_such_pkg.mod' \(No module named"
    ):
        build_datasets(TrainConfig(data="no_such_pkg.mod:make"))
    with pytest.raises(ConfigError, match=r"^data: module 'torch' has no attribute 'nothing_here'"):
        build_datasets(TrainConfig(data="torch:nothing_here"))
