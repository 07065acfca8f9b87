"""unittest suites as written for PyTorch's MultiProcessTestCase, moved to DistributedTestCase
by changing their base class (run through unittest's own API in test_harness_parity.py; not
collected by pytest: some fail on purpose)."""

import torch
import torch.distributed as dist

from refddp.testing import DistributedTestCase


class AllReduceSuite(DistributedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_all_reduce(self):
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank,
            world_size=self.world_size,
        )  # fmt: skip
        t = torch.ones(1) * self.rank
        dist.all_reduce(t)
        self.assertEqual(t.item(), 1.0)
        dist.destroy_process_group()

    def test_fails_on_rank_1(self):
        self.assertEqual(self.rank, 0, "rank 1 disagrees")

    def test_skipped(self):
        self.skipTest("not here")


class DefaultWorldSuite(DistributedTestCase):
    def test_world(self):
        self.assertEqual(dist.get_world_size(), self.world_size)
