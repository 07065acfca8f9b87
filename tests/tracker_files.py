"""Reading what the trackers wrote, with each tracker's own reader (shared by the tests).

TensorBoard: its ``EventAccumulator``, which applies ``purge_step`` as TensorBoard shows the
curves, and its raw event reader for the events as written (``board_events``). W&B: the
offline run's ``.wandb`` transaction log, each record parsed with wandb's own protobuf
schema (``wandb.proto.wandb_internal_pb2.Record``); wandb 0.31 ships no Python reader of the
file, so the framing (a LevelDB-style log: a 7-byte header, then 32 KiB blocks of records
with a 7-byte header each, long records split in parts) is read here.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(out: Path | str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of ``out/tensorboard`` -> its (step, value) points, as TensorBoard
    would show them."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(out, "tensorboard"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def board_summaries(out: Path) -> Iterator[Any]:
    """The summary events in ``out/tensorboard`` as written (TensorBoard's raw reader, before
    its migration of scalars into tensors), in file order."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    for path in sorted((out / "tensorboard").glob("events.out.tfevents.*")):
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            if event.HasField("summary"):
                yield event


def board_events(out: Path) -> list[tuple[int, list[str], dict[str, float]]]:
    """(step, tags, values) of each summary event in ``out/tensorboard``."""
    found = []
    for event in board_summaries(out):
        values = {v.tag: v.simple_value for v in event.summary.value}
        found.append((event.step, sorted(values), values))
    return found


def board_wall_times(out: Path) -> dict[int, float]:
    """Each summary event's step -> its wall time."""
    return {event.step: event.wall_time for event in board_summaries(out)}


def _wandb_records(path: str) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, parts, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts + chunk if kind == LAST else chunk)
            records.append(record)
            parts = b""
        elif kind in (FIRST, MIDDLE):
            parts += chunk
    return records


def wandb_segments(out: Path | str) -> list[dict]:
    """Each invocation's offline W&B run in ``out/wandb``, oldest first: its run id, its
    history rows ({"_step": ..., key: value}) and the exit code it finished with (None: not
    finished)."""
    segments = []
    for path in sorted(glob.glob(os.path.join(out, "wandb", "offline-run-*", "run-*.wandb"))):
        run_id, rows, exit_code = None, [], None
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "history":
                rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                             for item in record.history.item})  # fmt: skip
            elif kind == "exit":
                exit_code = record.exit.exit_code
        segments.append({"run_id": run_id, "rows": rows, "exit_code": exit_code})
    return segments


def wandb_curves(segments: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The run's curves as W&B keeps them: one run whose steps only increase, so a resumed
    segment's rows at or below the steps already logged are left out."""
    curves: dict[str, list[tuple[int, float]]] = {}
    last = -1
    for segment in segments:
        for row in segment["rows"]:
            if row["_step"] <= last:
                continue
            last = row["_step"]
            for key, value in row.items():
                if not key.startswith("_"):
                    curves.setdefault(key, []).append((row["_step"], value))
    return curves


def history(out: Path | str) -> list[dict]:
    """``out/history.jsonl``'s records, read as strict JSON (``NaN`` or ``Infinity`` fail)."""
    with open(os.path.join(out, "history.jsonl")) as f:
        return [json.loads(line, parse_constant=_not_json) for line in f if line.strip()]


def _not_json(constant: str):
    raise ValueError(f"history.jsonl holds {constant}, which strict JSON parsers refuse")
