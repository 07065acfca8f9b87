"""What refddp does on a torch older than the pin, simulated here by taking away what that
torch lacks (the compatibility job, ``make compat``, runs the real floor)."""

import inspect

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from refddp.checkpoints.loading import load_full_checkpoint
from refddp.launch import dist as refddp_dist
from tests.checkpoints.test_convert_checkpoint import a_dcp_checkpoint


def test_the_loopback_store_starts_where_libuv_takes_no_listening_socket(monkeypatch):
    real = dist.TCPStore
    refused = []

    def torch_2_5_store(*args, use_libuv=True, **kwargs):
        if use_libuv and kwargs.get("master_listen_fd") is not None:
            refused.append(True)
            raise NotImplementedError("The libuv TCPStore backend does not support ... fd")
        return real(*args, use_libuv=use_libuv, **kwargs)

    monkeypatch.setattr(dist, "TCPStore", torch_2_5_store)
    store = refddp_dist.loopback_store(timeout_s=10)
    assert refused, "the libuv store was tried first"
    store.set("k", "v")
    assert store.get("k") == b"v"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_dcp_checkpoint_is_read_alone_where_load_has_no_no_dist(monkeypatch, tmp_path):
    real_load = dcp.load
    called = []

    def torch_2_5_load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
                       process_group=None):  # fmt: skip
        raise AssertionError("refddp must not call load without no_dist where it lacks it")

    def load_state_dict(state_dict, storage_reader, no_dist=False, **kwargs):
        called.append(no_dist)
        real_load(state_dict, storage_reader=storage_reader, **kwargs)

    assert "no_dist" not in inspect.signature(torch_2_5_load).parameters
    monkeypatch.setattr(dcp, "load", torch_2_5_load)
    monkeypatch.setattr(dcp, "load_state_dict", load_state_dict)
    sharded = a_dcp_checkpoint(tmp_path / "x.dcp", torch.arange(3.0))
    full = load_full_checkpoint(str(sharded))
    assert torch.equal(full["model_state_dict"]["w"], torch.arange(3.0))
    assert called == [True]
