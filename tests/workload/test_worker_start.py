"""How loader workers start (refddp/workload/data.py ``worker_start_method``).

On Pythons with CPython gh-112275 a worker forked from a rank can deadlock before it runs a
line (a rank's gloo threads create Python thread states as they release finished collectives;
seen in CI and here, 3 runs in 100 under load). ``auto`` starts them from a forkserver there,
falls back to fork for a dataset that does not pickle (warned), and forks elsewhere.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch.utils.data import Dataset, SequentialSampler

from refddp.config.schema import ConfigError, TrainConfig
from refddp.workload import data


class ParentPid(Dataset):
    """Each sample: the process id of the parent of the process that fetched it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([os.getppid()])


class Unpicklable(ParentPid):
    def __init__(self) -> None:
        self.key = lambda i: i  # a local lambda: pickle refuses it


MODULE_LAMBDA = lambda i: i  # noqa: E731 - pickled by name, which names no lambda


class HoldsAModuleLambda(ParentPid):
    key = None

    def __init__(self) -> None:
        self.key = MODULE_LAMBDA


class ManyTensors(ParentPid):
    """300 tensors: forkserver passes one file descriptor for each, and refuses over 252."""

    def __init__(self) -> None:
        self.parts = [torch.zeros(1) for _ in range(300)]


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    monkeypatch.setattr(data, "_fork_instead", None)  # what an earlier fallback remembered


def parents(dataset: Dataset, **config) -> set[int]:
    c = TrainConfig(num_workers=1, **config)
    loader = data.make_loader(dataset, SequentialSampler(dataset), 2, c, False, seed=0)
    return {int(p) for batch in loader for p in batch.flatten()}


@pytest.mark.parametrize(
    ("version", "can_deadlock"),
    [((3, 10, 14), True), ((3, 10, 15), False), ((3, 11, 7), True), ((3, 11, 9), True),
     ((3, 11, 10), False), ((3, 12, 0), False), ((3, 13, 5), False)],  # fmt: skip
)
def test_the_pythons_whose_forked_children_can_deadlock(version, can_deadlock):
    assert data.fork_can_deadlock(version) is can_deadlock


def test_auto_starts_workers_from_a_forkserver_only_where_a_fork_can_deadlock(monkeypatch):
    monkeypatch.setattr(data, "fork_can_deadlock", lambda: True)
    assert data.worker_start_method(TrainConfig(num_workers=2)) == "forkserver"
    assert data.worker_start_method(TrainConfig(num_workers=0)) is None  # no workers
    assert data.worker_start_method(TrainConfig(num_workers=2, worker_start="fork")) == "fork"
    monkeypatch.setattr(data, "fork_can_deadlock", lambda: False)
    assert data.worker_start_method(TrainConfig(num_workers=2)) is None  # the platform's
    assert data.worker_start_method(TrainConfig(num_workers=2, worker_start="spawn")) == "spawn"


def test_on_such_a_python_workers_are_not_forked_from_the_rank(monkeypatch):
    monkeypatch.setattr(data, "fork_can_deadlock", lambda: True)
    assert os.getpid() not in parents(ParentPid())  # a forkserver's children
    assert parents(ParentPid(), worker_start="fork") == {os.getpid()}


@pytest.mark.parametrize("dataset", [Unpicklable, HoldsAModuleLambda, ManyTensors])
def test_a_dataset_workers_cannot_get_from_a_forkserver_loads_through_forked_ones_warned_once(
    monkeypatch, caplog, dataset
):
    monkeypatch.setattr(data, "fork_can_deadlock", lambda: True)
    with caplog.at_level(logging.WARNING, logger="refddp.workload.data"):
        assert parents(dataset()) == {os.getpid()}
        assert parents(dataset()) == {os.getpid()}  # a later loader (an evaluation's) too
    assert caplog.text.count("loader workers fork: they could not start from a forkserver") == 1
    assert "gh-112275" in caplog.text
    monkeypatch.setattr(data, "_fork_instead", None)
    with pytest.raises(Exception):  # noqa: B017 - asked for by name: no fallback
        parents(dataset(), worker_start="forkserver")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("dataset", [Unpicklable, HoldsAModuleLambda])
def test_a_dataset_that_does_not_pickle_under_an_explicit_start_is_one_line_naming_the_option(
    recwarn, method, dataset
):
    # It was multiprocessing's traceback (and torch's warning), on every rank.
    with pytest.raises(ConfigError) as raised:
        parents(dataset(), worker_start=method)
    said = str(raised.value)
    assert said.startswith(f"worker_start: {method} starts each loader worker with the dataset "
                           "pickled, and it does not pickle (") and "\n" not in said  # fmt: skip
    assert said.endswith("give --worker-start fork or auto, or a dataset that pickles")
    assert not [w for w in recwarn if "pickle" in str(w.message)], "the line says it once"
