"""Datasets (built-in synthetic, tensor file, image folder, user callable) and the samplers
that shard them.

Sharding contract: in epoch ``e`` the global order is one permutation of the training set
(seeded by ``seed + e``, the same for every world size), cut into whole global batches; global
step ``k`` trains on samples ``perm[k*G:(k+1)*G]`` however they are split over ranks and
accumulation steps. That is what makes runs world-size invariant and mid-epoch resume exact.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import is_import_path
from refddp.launch.stop_signals import StopRequest
from refddp.workload.image_folder import image_folders, is_image_folder
from refddp.workload.imports import load_callable
from refddp.workload.objectives.batches import IGNORE_INDEX

log = logging.getLogger(__name__)


class _Batch(tuple):
    """A batch a dataset built itself; collate_batch passes it through."""


class TensorPairDataset(Dataset):
    """``(x[i], y[i])`` pairs, optionally augmented with Gaussian noise of std ``noise``.

    The noise is drawn from torch's global RNG inside ``__getitem__``, as user augmentations
    are, so it runs in DataLoader workers. A plain ``DataLoader`` with default collation works;
    refddp's own loader fetches un-augmented batches whole (``batch``) as a fast path.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, noise: float = 0.0):
        assert len(x) == len(y)
        self.x, self.y, self.noise = x, y, noise
        # No target is ignored (-100): a loss counts a batch's targets on the host (its
        # number), with no device op per step (``Objective.count_on_host``).
        self.every_target_scored = not bool((y == IGNORE_INDEX).any())

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[index]
        if self.noise:
            x = x + self.noise * torch.randn(x.shape, dtype=x.dtype)
        return x, self.y[index]

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``indices`` stacked, in one indexing operation (no augmentation)."""
        idx = torch.as_tensor(indices)
        return self.x[idx], self.y[idx]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The RNG seed sample ``index`` is fetched (augmented) with in ``epoch``."""
    return ((seed * 1_000_003 + epoch) * 2_147_483_659 + index) % 2**63


class SeededFetch(Dataset):
    """What refddp's loaders fetch from: ``dataset``, each sample under its own torch seed.

    Random augmentation inside ``__getitem__`` then depends only on (seed, epoch, sample):
    not on which worker, rank or resume fetched it, so mid-epoch resume is exact and
    augmentation is the same at any world size. Only torch's RNG is seeded (Python's
    ``random`` and numpy are left to the workers' own seeds). The caller's RNG is restored.
    """

    def __init__(self, dataset: Dataset, seed: int, epoch: int):
        self.dataset, self.seed, self.epoch = dataset, seed, epoch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self._seeded([index])[0]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        ds = self.dataset
        if isinstance(ds, TensorPairDataset) and not ds.noise:
            return [_Batch(ds.batch(indices))]  # nothing random: one indexing op per batch
        return self._seeded(indices)

    def _seeded(self, indices: list[int]) -> list[Any]:
        ds = self.dataset
        outer = torch.get_rng_state()
        try:
            items = []
            for i in indices:
                # the CPU generator only: torch.manual_seed would also reseed every GPU's
                torch.default_generator.manual_seed(sample_seed(self.seed, self.epoch, i))
                items.append(ds[i])
        finally:
            torch.set_rng_state(outer)
        return items


def collate_batch(items: list) -> Any:
    """Collate for SeededFetch's pre-built batch; default collation for anything else."""
    if len(items) == 1 and isinstance(items[0], _Batch):
        return tuple(items[0])
    return torch.utils.data.default_collate(items)


def synthetic(c: TrainConfig) -> tuple[TensorPairDataset, TensorPairDataset]:
    """A learnable classification task generated from ``seed``: labels from a random teacher."""
    g = torch.Generator().manual_seed(c.seed + 12345)
    dtype = getattr(torch, c.dtype)
    teacher = torch.randn(c.input_dim, c.num_classes, generator=g, dtype=torch.float64)
    mix = torch.randn(c.input_dim, c.input_dim, generator=g, dtype=torch.float64)

    def make(n: int, noise: float) -> TensorPairDataset:
        x = torch.randn(n, c.input_dim, generator=g, dtype=torch.float64)
        y = (x @ teacher + 0.25 * torch.tanh(x @ mix) @ teacher).argmax(dim=1)
        return TensorPairDataset(x.to(dtype), y, noise)

    return make(c.train_size, c.augment), make(c.val_size, 0.0)


def from_tensor_file(c: TrainConfig) -> tuple[TensorPairDataset, TensorPairDataset]:
    """A ``.pt`` dict with ``x`` and ``y`` (last 10% is validation) or train_/val_ pairs."""
    path = c.data
    if not os.path.isfile(path):
        raise ConfigError(f"data: file not found: {path}")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"data: cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(blob, dict):
        raise ConfigError(f"data: {path} must hold a dict with x and y tensors")
    if {"train_x", "train_y", "val_x", "val_y"} <= blob.keys():
        train = _checked_pair(blob, "train_x", "train_y", path, c)
        val = _checked_pair(blob, "val_x", "val_y", path, c)
    elif {"x", "y"} <= blob.keys():
        x, y = _checked_pair(blob, "x", "y", path, c)
        n_val = max(1, len(x) // 10)
        train, val = (x[:-n_val], y[:-n_val]), (x[-n_val:], y[-n_val:])
    else:
        raise ConfigError(
            f"data: {path} must hold keys x, y (or train_x, train_y, val_x, val_y); "
            f"found {', '.join(sorted(map(str, blob))) or 'none'}"
        )
    dtype = getattr(torch, c.dtype)
    out = [TensorPairDataset(x.to(dtype), y) for x, y in (train, val)]
    out[0].noise = c.augment  # training samples only
    return out[0], out[1]


def _checked_pair(blob: dict, x_key: str, y_key: str, path: str,
                  c: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``blob[x_key], blob[y_key]`` if they are a float (N, input_dim) tensor and N int64
    labels in [0, num_classes) or the loss's ignore index (-100); else one line naming them."""
    x, y = blob[x_key], blob[y_key]
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ConfigError(f"data: {x_key} and {y_key} in {path} must be tensors")
    if not x.is_floating_point() or x.dim() != 2 or x.shape[1] != c.input_dim:
        raise ConfigError(
            f"data: {x_key} in {path} must be a float tensor of shape (N, input_dim="
            f"{c.input_dim}), got {str(x.dtype)[6:]} {tuple(x.shape)}"
        )
    if y.dtype != torch.int64 or y.dim() != 1 or len(y) != len(x):
        raise ConfigError(
            f"data: {y_key} in {path} must be an int64 tensor of shape ({len(x)},) (one label "
            f"for each row of {x_key}), got {str(y.dtype)[6:]} {tuple(y.shape)}"
        )
    labels = y[y != IGNORE_INDEX]
    if len(labels) and (labels.min() < 0 or labels.max() >= c.num_classes):
        raise ConfigError(
            f"data: labels in {y_key} of {path} must lie in [0, num_classes={c.num_classes}) "
            f"or be {IGNORE_INDEX} (ignored), found {int(labels.min())}..{int(labels.max())}"
        )
    return x, y


def build_datasets(config: TrainConfig | dict[str, Any]) -> tuple[Dataset, Dataset]:
    """``(train, val)`` map-style datasets of ``(input, target)`` pairs for this config.

    Takes a ``TrainConfig`` or the ``config`` dict stored in a checkpoint. A ``data`` of the
    form ``package.module:callable`` is imported and called: that runs the module's code, so
    pass only configs whose import paths you trust (the CLI refuses one that only a checkpoint
    names). A ``.pt`` file is loaded with ``weights_only=True``: it cannot run code.
    """
    c = config if isinstance(config, TrainConfig) else TrainConfig(**config)
    if c.data == "synthetic":
        return synthetic(c)
    if c.data.endswith((".pt", ".pth")):
        return from_tensor_file(c)
    if is_image_folder(c.data):
        return image_folders(c)
    if is_import_path(c.data):
        result = load_callable(c.data, "data")(c)
        if not (isinstance(result, tuple | list) and len(result) == 2):
            raise ConfigError(f"data: {c.data!r} must return (train, val) datasets")
        for ds in result:
            if not hasattr(ds, "__len__") or not hasattr(ds, "__getitem__"):
                raise ConfigError(
                    f"data: {c.data!r} must return map-style datasets "
                    "(with __len__ and __getitem__)"
                )
        return result[0], result[1]
    raise ConfigError(
        f"data: {c.data!r} is not 'synthetic', a .pt file, a directory of images "
        "(train/ and val/ class folders) or package.module:callable"
    )


class GlobalBatchSampler(DistributedSampler):
    """DistributedSampler over whole global batches that can start mid-epoch.

    Keeps DistributedSampler's per-epoch permutation (``seed + epoch``) and interleaving
    (rank r takes every world_size-th index), drops the tail that would not fill a global
    batch (so every rank runs the same number of steps, with no duplicated samples) and skips
    the first ``start`` samples of the global order when resuming.
    """

    def __init__(self, dataset: Dataset, world_size: int, rank: int, global_batch: int, seed: int):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.global_batch = global_batch
        self.steps_per_epoch = len(dataset) // global_batch  # type: ignore[arg-type]
        self.start = 0

    def set_start(self, consumed_samples: int) -> None:
        """Skip the first ``consumed_samples`` of this epoch's global order (a resume)."""
        assert consumed_samples % self.global_batch == 0
        self.start = consumed_samples

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=g)  # type: ignore[arg-type]
        usable = order[self.start : self.steps_per_epoch * self.global_batch]
        return iter(usable[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        return (self.steps_per_epoch * self.global_batch - self.start) // self.num_replicas


class ShardSampler(Sampler[int]):
    """Rank r gets indices r, r+W, r+2W...: every sample exactly once, no padding (for eval)."""

    def __init__(self, length: int, world_size: int, rank: int):
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _quiet_worker(worker_id: int) -> None:
    # Loader workers leave signals to their rank: it stops at a step boundary, then shuts them.
    # (SLURM signals every process of a job step, workers included: SIGUSR1 would kill them.)
    for sig in StopRequest.SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


# CPython gh-112275: a forked child can deadlock before it runs a line if, at the fork, another
# thread was creating a Python thread state. A rank's gloo (and NCCL) threads do that each time
# they release a finished collective that holds a tensor, so a rank forking loader workers hangs
# now and then (seen here: 3 runs in 100 under load). Fixed in these releases, and from 3.12 on.
_FORK_DEADLOCK_FIXED_IN = {(3, 10): 15, (3, 11): 10}


def fork_can_deadlock(version: tuple = tuple(sys.version_info[:3])) -> bool:
    """Whether this CPython has gh-112275 (3.10 before 3.10.15, 3.11 before 3.11.10)."""
    fixed_in = _FORK_DEADLOCK_FIXED_IN.get(tuple(version[:2]))
    return fixed_in is not None and version[2] < fixed_in


_fork_instead: str | None = None  # why this process's auto loaders fork after all, once known
_preload_set = False


def worker_start_method(c: TrainConfig) -> str | None:
    """How this run's loader workers start (None: no workers, or the platform's default: fork
    on Linux before Python 3.14, forkserver from 3.14).

    ``auto`` is forkserver where ``fork_can_deadlock``: workers fork from a process with no
    other thread, so none can hold the lock. It costs one clean process per rank, which
    imports the rank's main module, torch and this module once; the dataset must pickle (its
    tensors then move to shared memory, /dev/shm, once per rank). Where it does not,
    ``LoaderFallback`` forks, warned once, and so does every later loader of the process.
    """
    global _preload_set
    if not c.num_workers:
        return None
    if c.worker_start != "auto":
        return c.worker_start
    if not (sys.platform.startswith("linux") and fork_can_deadlock()):
        return None
    if _fork_instead is not None:
        return "fork"
    if not _preload_set:  # (before the server starts, which the first loader's workers do)
        multiprocessing.set_forkserver_preload(["__main__", "torch", "refddp.workload.data"])
        _preload_set = True
    return "forkserver"


@contextlib.contextmanager
def _without_torchs_pickle_warning() -> Iterator[None]:
    """Without the warning torch (2.13) gives where a worker's arguments do not pickle:
    refddp's own warning or error says it, naming the option."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Got pickle error", UserWarning)
        yield


class LoaderFallback(DataLoader):
    """A DataLoader whose workers fork after all when ``auto`` chose forkserver and they could
    not start from it: a dataset that does not pickle (a lambda, a class defined in
    ``__main__``), holds too many tensors to pass (one descriptor each, 252 at most) or does
    not fit in /dev/shm. The run then works as it did with fork; the warning names the risk."""

    def __iter__(self) -> Any:
        global _fork_instead
        try:
            with _without_torchs_pickle_warning():  # the warning below says it
                return super().__iter__()
        except Exception as exc:  # noqa: BLE001 - an error of the data itself recurs under fork
            if self.multiprocessing_context is None or _fork_instead is not None:
                raise
            _fork_instead = f"{type(exc).__name__}: {exc}"
            fixed = _FORK_DEADLOCK_FIXED_IN.get(sys.version_info[:2])
            log.warning("loader workers fork: they could not start from a forkserver (%s); on "
                        "Python %s a forked worker can deadlock (CPython gh-112275): use Python "
                        "%d.%d.%s+ or 3.12+, or a dataset that pickles", _fork_instead,
                        ".".join(map(str, sys.version_info[:3])), *sys.version_info[:2],
                        fixed)  # fmt: skip
            self.multiprocessing_context = "fork"
            return super().__iter__()


class StartLoader(DataLoader):
    """A DataLoader whose workers start as ``--worker-start spawn`` or ``forkserver`` says:
    such a worker gets the dataset pickled, and one that does not pickle (a lock, a lambda, a
    class defined in ``__main__``) is one line naming the option, not multiprocessing's
    traceback (``auto`` forks instead: ``LoaderFallback``)."""

    def __iter__(self) -> Any:
        try:
            with _without_torchs_pickle_warning():  # the line below says it
                return super().__iter__()
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            if self.multiprocessing_context is None or "pickle" not in str(exc):
                raise
            method = self.multiprocessing_context.get_start_method()
            raise ConfigError(
                f"worker_start: {method} starts each loader worker with the dataset pickled, "
                f"and it does not pickle ({type(exc).__name__}: {exc}); give --worker-start "
                "fork or auto, or a dataset that pickles"
            ) from None


def make_loader(
    dataset: Dataset, sampler: Sampler, batch_size: int, c: TrainConfig, pin: bool, seed: int
) -> DataLoader:
    """A DataLoader over ``dataset`` with per-sample seeds (``SeededFetch``) for the sampler's
    epoch; worker seeds (Python, numpy) come from ``seed``; workers started as
    ``worker_start_method`` says."""
    method = worker_start_method(c)
    loader = LoaderFallback if c.worker_start == "auto" else StartLoader
    loader = DataLoader if method is None else loader
    return loader(
        SeededFetch(dataset, c.seed, getattr(sampler, "epoch", 0)),
        batch_size=batch_size,
        sampler=sampler,
        num_workers=c.num_workers,
        pin_memory=pin,
        collate_fn=collate_batch,
        worker_init_fn=_quiet_worker if c.num_workers else None,
        generator=torch.Generator().manual_seed(seed),
        drop_last=False,
        multiprocessing_context=method,
    )
