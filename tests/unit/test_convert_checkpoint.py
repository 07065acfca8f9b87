"""``python -m refddp.convert_checkpoint`` on bad input, and reading a dcp checkpoint without
running code (DCP itself unpickles its ``.metadata`` freely; refddp does not)."""

import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from refddp import checkpoint_dcp, convert_checkpoint
from refddp.checkpoint import CheckpointError


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_is_one_line_naming_the_path_exit_2(tmp_path, capsys):
    (tmp_path / "empty.dcp").mkdir()
    cases = [
        ([str(tmp_path / "missing.dcp"), str(tmp_path / "o.pth")], "missing.dcp"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "o.pth")], "empty.dcp: not a dcp checkpoint"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "o.txt")], "o.txt"),
        ([str(tmp_path / "empty.dcp"), str(tmp_path / "no" / "o.pth")], "does not exist"),
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


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_dcp_checkpoint_holding_pickled_objects_is_refused(tmp_path):
    state = {"model/w": torch.ones(2), "extra": {"note": "a pickled object in DCP"}}
    dcp.save(state, checkpoint_id=str(tmp_path / "x.dcp"), no_dist=True)
    with pytest.raises(CheckpointError, match="holds pickled objects"):
        checkpoint_dcp.read_metadata(str(tmp_path / "x.dcp"))
    # A checkpoint of tensors only reads: the allow-list covers what DCP's metadata holds.
    dcp.save({"model/w": torch.ones(2)}, checkpoint_id=str(tmp_path / "y.dcp"), no_dist=True)
    assert list(checkpoint_dcp.read_metadata(str(tmp_path / "y.dcp")).state_dict_metadata) == [
        "model/w"
    ]
