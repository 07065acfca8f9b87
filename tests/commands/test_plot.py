"""`python -m refddp.plot RUN_DIR`: curves from history.jsonl, clear errors otherwise."""

import json

import pytest

from refddp.plot import main


def write_history(run_dir, n=3):
    rows = [
        {
            "epoch": i + 1,
            "step": 10 * (i + 1),
            "train_loss": 1.0 / (i + 1),
            "val_loss": 1.1 / (i + 1),
            "val_acc": 0.5 + 0.1 * i,
            "samples_per_s": 1000.0,
        }
        for i in range(n)
    ]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_writes_a_png_into_the_run_directory(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    write_history(tmp_path)
    assert main([str(tmp_path)]) == 0
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert capsys.readouterr().out.strip() == str(png)


def test_missing_history_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path}/history.jsonl: not found (is {tmp_path} a refddp run directory?)"
    )


def test_broken_line_is_named(tmp_path, capsys):
    write_history(tmp_path)
    with open(tmp_path / "history.jsonl", "a") as f:
        f.write("{not json\n")
    assert main([str(tmp_path)]) == 2
    assert "history.jsonl:4: not a JSON line" in capsys.readouterr().err


def test_missing_matplotlib_is_a_clear_message(tmp_path, capsys, monkeypatch):
    write_history(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    assert main([str(tmp_path)]) == 2
    assert "matplotlib is not installed: pip install 'refddp[plot]'" in capsys.readouterr().err
