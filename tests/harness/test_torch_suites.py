"""PyTorch-style suites, unmodified, run on warm pools with ``--dist-torch-suites``.

The files below are written as PyTorch's own are: on ``MultiProcessTestCase`` and on
``DTensorTestBase`` with ``@with_comms``, imported from ``torch.testing._internal`` (shipped in
the wheel), with no line changed for refddp. pytest runs them in a project of their own.
"""

import pytest

from tests.torch_features import needs_fsdp2, needs_torch_213_test_helpers

pytest.importorskip("expecttest")  # torch.testing._internal.common_utils needs it

MULTIPROCESS = '''
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase, skip_if_lt_x_gpu
from torch.testing._internal.common_utils import run_tests


class GlooStyleTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def test_all_reduce(self):
        self._init()
        t = torch.ones(2) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 3.0))
        dist.destroy_process_group()

    def test_a_group_object_broadcasts(self):
        self._init()
        pg = dist.distributed_c10d._get_default_group()
        t = torch.full((3,), float(self.rank))
        pg.broadcast(t, 0).wait()
        self.assertEqual(t, torch.zeros(3))

    def test_fails_on_rank_1(self):
        self.assertEqual(self.rank, 0, "rank 1 disagrees")

    @skip_if_lt_x_gpu(2)
    def test_needs_two_gpus(self):
        pass

    def test_where_the_file_name_is_the_same(self):
        store = dist.FileStore(self.file_name, self.world_size)
        store.set(f"rank{self.rank}", "here")
        store.wait([f"rank{r}" for r in range(self.world_size)])


class OneRankTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 1

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_init_process_group_for_all_backends(self):
        import torch.testing._internal.distributed.fake_pg  # noqa: F401
        import torch.testing._internal.distributed.multi_threaded_pg  # noqa: F401

        for backend in ("gloo", "fake", "threaded"):
            store = dist.FileStore(self.file_name, self.world_size)
            dist.init_process_group(backend=backend, rank=self.rank,
                                    world_size=self.world_size, store=store)
            pg = dist.distributed_c10d._get_default_group()
            self.assertEqual(pg.name(), "custom" if backend == "fake" else backend)  # (2.13)
            dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
'''

DTENSOR = '''
import torch
from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms


class ShardingTest(DTensorTestBase):
    @with_comms
    def test_shard_then_replicate(self):
        mesh = DeviceMesh(self.device_type, list(range(self.world_size)))
        t = torch.arange(16.0).reshape(8, 2)
        sharded = distribute_tensor(t, mesh, [Shard(0)])
        self.assertEqual(sharded.to_local().shape, (8 // self.world_size, 2))
        self.assertEqual(sharded.redistribute(mesh, [Replicate()]).to_local(), t)

    @with_comms
    def test_world_size_is_the_bases(self):
        self.assertEqual(self.world_size, 4)


if __name__ == "__main__":
    run_tests()
'''


FSDP = '''
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.common_fsdp import FSDPTest
from torch.testing._internal.common_utils import run_tests


class ShardedTrainingTest(FSDPTest):
    @property
    def world_size(self):
        return 2

    def test_fully_shard_runs_a_backward(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        model(torch.ones(3, 4)).sum().backward()
        self.assertEqual(model[0].weight.to_local().shape, (2, 4))


if __name__ == "__main__":
    run_tests()
'''


@needs_fsdp2  # (FSDPTest itself imports on older torch; fully_shard is public from 2.6)
@pytest.mark.slow  # a pytest session of its own on 4-rank pools: ~26 s (compat runs it)
def test_an_unmodified_fsdptest_suite_runs_on_warm_pools(pytester):
    pytester.makepyfile(test_fsdp_style=FSDP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dist-torch-suites",
                                           timeout=300)  # fmt: skip
    result.assert_outcomes(passed=1)


@pytest.mark.slow  # two pytest sessions on 2- and 4-rank pools: ~34 s (compat runs it)
@needs_torch_213_test_helpers
def test_unmodified_multiprocesstestcase_and_dtensor_suites_run_on_warm_pools(pytester):
    pytester.makepyfile(test_gloo_style=MULTIPROCESS, test_dtensor_style=DTENSOR)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dist-torch-suites",
                                           "-rs", "-v", timeout=300)  # fmt: skip
    result.assert_outcomes(passed=6, failed=1, skipped=1)
    out = result.stdout.str()
    assert "GlooStyleTest::test_fails_on_rank_1 FAILED" in out
    assert "rank 1 failed first: AssertionError:" in out and "rank 1 disagrees" in out
    assert "Need at least 2 CUDA devices" in out
    assert "OneRankTest::test_init_process_group_for_all_backends PASSED" in out


@needs_torch_213_test_helpers
def test_without_the_option_the_suites_base_class_is_torchs_own(pytester):
    pytester.makepyfile(test_which="""
from torch.testing._internal.common_distributed import MultiProcessTestCase

def test_base():
    assert MultiProcessTestCase.__module__ == "torch.testing._internal.common_distributed"
""")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120).assert_outcomes(passed=1)
