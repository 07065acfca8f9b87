"""The launcher's one-line account of failed ranks (``refddp.launch.torchrun._report_failure``).

torch's agent ends every rank as soon as one exits non-zero, so ranks that stopped together
reach the launcher as a mix of exit codes and SIGTERMs; what the ranks recorded, not how they
ended, decides the line.
"""

from __future__ import annotations

import json
import signal

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from refddp.launch import torchrun as launch

STOP = "step 8: non-finite loss on 1 of 2 rank(s); stopping every rank (on_nonfinite=stop)"


def _failure(tmp_path, rank: int, exitcode: int, record: tuple[str, str] | None):
    error_file = tmp_path / f"error{rank}.json"
    if record is not None:
        message, kind = record
        error_file.write_text(json.dumps({"message": message, "timestamp": 0,
                                          launch.KIND_KEY: kind}))  # fmt: skip
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode,
                          error_file=str(error_file))  # fmt: skip


def _report(tmp_path, capsys, *failures) -> tuple[int, list[str]]:
    exc = ChildFailedError("refddp.train", {f.local_rank: f for f in failures})
    code = launch._report_failure(exc, str(tmp_path), "training")
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("rank0_end", [1, -signal.SIGTERM], ids=["exited", "ended-by-agent"])
def test_an_agreed_stop_is_one_line_however_each_rank_ended(
    tmp_path, capsys, rank0_end
):
    code, lines = _report(tmp_path, capsys,
                          _failure(tmp_path, 0, rank0_end, (STOP, launch.AGREED_STOP)),
                          _failure(tmp_path, 1, 1, (STOP, launch.AGREED_STOP)))  # fmt: skip
    assert code == 1
    assert lines == [f"error: {STOP}"]


def test_a_rank_that_did_not_record_the_stop_is_named_by_how_it_ended(tmp_path, capsys):
    code, lines = _report(tmp_path, capsys,
                          _failure(tmp_path, 0, -signal.SIGTERM, None),
                          _failure(tmp_path, 1, 1, (STOP, launch.AGREED_STOP)))  # fmt: skip
    assert code == 1
    assert lines[0] == f"error: {STOP}"
    assert lines[1].startswith("error: training failed: rank 0 killed by SIGTERM;"), lines


def test_usage_errors_come_first_with_exit_code_2(tmp_path, capsys):
    code, lines = _report(tmp_path, capsys,
                          _failure(tmp_path, 0, 2, ("data: file not found: x.pt", launch.USAGE)),
                          _failure(tmp_path, 1, -signal.SIGTERM, None))  # fmt: skip
    assert code == 2
    assert lines == ["error: data: file not found: x.pt (rank 0)"]


def test_a_torch_without_the_launchers_internals_is_told_to_use_torchrun(monkeypatch, capsys):
    import torch.distributed.run

    monkeypatch.delattr(torch.distributed.run, "config_from_args")
    monkeypatch.delattr(launch.DynamicRendezvousHandler, "_create_tcp_store_server")
    assert launch.launch("refddp.train", {}, 2, 0, "unused", job="training") == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --nproc: this torch"), lines
    assert "lacks config_from_args, DynamicRendezvousHandler._create_tcp_store_server" in lines[0]
    assert lines[0].endswith("start the ranks with torchrun --nproc-per-node N -m refddp.train "
                             "instead")  # fmt: skip
