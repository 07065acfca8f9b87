"""``python -m refddp.convert_checkpoint`` on bad input, and reading a dcp checkpoint without
running code (DCP itself unpickles its ``.metadata`` freely; refddp does not)."""

import inspect
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from refddp import convert_checkpoint
from refddp.checkpoints import dcp as checkpoint_dcp
from refddp.checkpoints.loading import load_full_checkpoint
from refddp.checkpoints.run_files import RunFileError
from refddp.checkpoints.run_state import CheckpointError

# dcp.save in this process alone: its no_dist option is torch >= 2.6; before, it saves alone
# whenever no process group is up, as here.
ALONE = {"no_dist": True} if "no_dist" in inspect.signature(dcp.save).parameters else {}


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_is_one_line_naming_the_path_exit_2(tmp_path, capsys):
    (tmp_path / "empty.dcp").mkdir()
    (tmp_path / "f").touch()  # an output under a file
    cases = [
        ([str(tmp_path / "missing.dcp"), str(tmp_path / "o.pth")], "missing.dcp"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "o.pth")], "empty.dcp: not a dcp checkpoint"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "o.txt")], "o.txt"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "no" / "o.pth")], "does not exist"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "f" / "d" / "o.pth")],
         f"o.pth: {tmp_path / 'f'} is a file"),
        ([str(tmp_path / "empty.dcp")], "arguments are required: out"),
    ]
    for argv, named in cases:
        assert convert_checkpoint.main(argv) == 2, argv
        line = error_line(capsys)
        assert line.startswith("error: ") and named in line, line
    assert not (tmp_path / "o.pth").exists()


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def test_a_metadata_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    checkpoint = tmp_path / "evil.dcp"
    checkpoint.mkdir()
    (checkpoint / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    assert convert_checkpoint.main([str(checkpoint), str(tmp_path / "o.pth")]) == 2
    line = error_line(capsys)
    assert "evil.dcp: refused" in line and "builtins.exec" in line
    assert not marker.exists()
    # A function reached through an allowed module by a dotted name is refused too.
    dotted = b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x8c\ntorch.load\x93."
    (checkpoint / ".metadata").write_bytes(dotted)
    with pytest.raises(CheckpointError, match="refused"):
        checkpoint_dcp.read_metadata(str(checkpoint))
    # Of DCP's filesystem module, only its plain dataclasses (the storage records) are allowed.
    module = b"torch.distributed.checkpoint.filesystem"
    writer = b"\x80\x04\x8c" + bytes([len(module)]) + module + b"\x8c\x10FileSystemWriter\x93."
    (checkpoint / ".metadata").write_bytes(writer)
    with pytest.raises(CheckpointError, match="refused.*FileSystemWriter"):
        checkpoint_dcp.read_metadata(str(checkpoint))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_dcp_checkpoint_holding_pickled_objects_is_refused(tmp_path):
    state = {"model/w": torch.ones(2), "extra": {"note": "a pickled object in DCP"}}
    dcp.save(state, checkpoint_id=str(tmp_path / "x.dcp"), **ALONE)
    with pytest.raises(CheckpointError, match="holds pickled objects"):
        checkpoint_dcp.read_metadata(str(tmp_path / "x.dcp"))
    # A checkpoint of tensors only reads: the allow-list covers what DCP's metadata holds.
    dcp.save({"model/w": torch.ones(2)}, checkpoint_id=str(tmp_path / "y.dcp"), **ALONE)
    assert list(checkpoint_dcp.read_metadata(str(tmp_path / "y.dcp")).state_dict_metadata) == [
        "model/w"
    ]


def a_dcp_checkpoint(path, w, layout=None):
    """A minimal refddp dcp checkpoint of one tensor ``model/w``, written in this process."""
    dcp.save({"model/w": w}, checkpoint_id=str(path), **ALONE)
    run_state = {
        "optimizer_state_dict": {"param_groups": []}, "scaler_state_dict": {}, "epoch": 0,
        "step": 1, "world_size": 1, "config": {}, "metrics": {},
        checkpoint_dcp.LAYOUT: layout or {"model": ["model/w"], "parameters": []},
    }  # fmt: skip
    torch.save(run_state, path / checkpoint_dcp.RUN_STATE)
    return path


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_full_checkpoint_of_either_format_is_the_plain_files_dict(tmp_path, capsys):
    sharded = a_dcp_checkpoint(tmp_path / "x.dcp", torch.arange(3.0))
    full = load_full_checkpoint(str(sharded))  # the tensors read, the dcp bookkeeping gone
    assert torch.equal(full["model_state_dict"]["w"], torch.arange(3.0))
    assert checkpoint_dcp.KEY not in full and checkpoint_dcp.LAYOUT not in full
    assert convert_checkpoint.main([str(sharded), str(tmp_path / "x.pth")]) == 0
    plain = load_full_checkpoint(str(tmp_path / "x.pth"))
    assert plain.keys() == full.keys()
    assert torch.equal(plain["model_state_dict"]["w"], torch.arange(3.0))
    # A plain file is the full format already: nothing for the converter to do.
    assert convert_checkpoint.main([str(tmp_path / "x.pth"), str(tmp_path / "y.pth")]) == 2
    assert "x.pth: not a dcp checkpoint (not a directory)" in error_line(capsys)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_mismatched_or_corrupt_checkpoint_is_one_line_exit_2(tmp_path, capsys):
    out = str(tmp_path / "o.pth")
    mismatched = a_dcp_checkpoint(tmp_path / "m.dcp", torch.ones(3),
                                  layout={"model": ["model/gone"], "parameters": []})  # fmt: skip
    assert convert_checkpoint.main([str(mismatched), out]) == 2
    line = error_line(capsys)
    assert "m.dcp: its run_state.pth does not match its tensors" in line, line
    corrupt = a_dcp_checkpoint(tmp_path / "c.dcp", torch.ones(3))
    for shard in corrupt.glob("*.distcp"):
        shard.write_bytes(b"\0" * shard.stat().st_size)  # whole, but not a tensor
    assert convert_checkpoint.main([str(corrupt), out]) == 2
    line = error_line(capsys)
    assert "c.dcp: cannot read its tensors" in line and "Traceback" not in line, line
    assert not (tmp_path / "o.pth").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_checkpoint_with_a_missing_or_short_shard_file_is_refused(tmp_path):
    checkpoint = a_dcp_checkpoint(tmp_path / "x.dcp", torch.ones(64))
    (shard,) = checkpoint.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match=r"x.dcp: incomplete dcp checkpoint: .* truncated"):
        checkpoint_dcp.load_run_state(str(checkpoint))
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"x.dcp: incomplete .* missing .*shared by every"):
        checkpoint_dcp.load_run_state(str(checkpoint))
    # Rank 0 checks before publishing: latest is never pointed at it.
    state = {"step": 7, **torch.load(checkpoint / checkpoint_dcp.RUN_STATE, weights_only=True)}
    with pytest.raises(RunFileError, match=r"cannot complete checkpoint .*x.dcp: incomplete"):
        checkpoint_dcp._publish(state, str(tmp_path), str(checkpoint), is_best=False)
    assert not os.path.lexists(tmp_path / checkpoint_dcp.LATEST)
    assert not (tmp_path / "checkpoint_step00000007.dcp").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_link_is_resolved_once_so_tensors_come_from_the_run_states_checkpoint(tmp_path):
    a_dcp_checkpoint(tmp_path / "checkpoint_step00000001.dcp", torch.ones(3))
    a_dcp_checkpoint(tmp_path / "checkpoint_step00000002.dcp", torch.full((3,), 2.0))
    link = tmp_path / checkpoint_dcp.LATEST
    link.symlink_to("checkpoint_step00000001.dcp")
    state = checkpoint_dcp.load_run_state(str(link))
    link.unlink()
    link.symlink_to("checkpoint_step00000002.dcp")  # a live run saved meanwhile
    assert torch.equal(checkpoint_dcp.load_full(state)["model_state_dict"]["w"], torch.ones(3))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_metadata_of_the_wrong_shape_is_one_line_not_a_traceback(tmp_path, capsys):
    checkpoint = a_dcp_checkpoint(tmp_path / "x.dcp", torch.ones(3))
    metadata = checkpoint_dcp.read_metadata(str(checkpoint))
    for damage in ({"storage_data": None}, {"state_dict_metadata": []}):
        bad = dcp.metadata.Metadata(**{"state_dict_metadata": metadata.state_dict_metadata,
                                       "storage_data": metadata.storage_data, **damage})
        (checkpoint / ".metadata").write_bytes(pickle.dumps(bad))
        assert convert_checkpoint.main([str(checkpoint), str(tmp_path / "o.pth")]) == 2
        line = error_line(capsys)
        assert "x.dcp: corrupt dcp .metadata" in line, line
