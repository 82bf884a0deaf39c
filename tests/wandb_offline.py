"""Read a W&B offline run back, for the tests that check what a recipe logged to W&B.

``tokenswap compare`` reads recipe output folders (``log_history.json``), not W&B's private record log; this reader
of the ``.wandb`` framing (LevelDB log blocks of protobuf records) lives with the tests that need it.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from pathlib import Path

from tokenswap.compare import RunRecord


def wandb_records(path: str):
    """Yield the protobuf records of a ``.wandb`` file (LevelDB log framing, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (bad magic {data[:4]!r}); point --runs at a "
                         "wandb/offline-run-* folder W&B wrote, or leave it out")
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # the writer pads the tail of a block that cannot hold a header
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # FULL
            chunk = payload
        elif kind == 2:  # FIRST
            pending = payload
            continue
        elif kind == 3:  # MIDDLE
            pending += payload
            continue
        else:  # LAST
            chunk, pending = pending + payload, b""
        record = pb.Record()
        record.ParseFromString(chunk)
        yield record


def read_wandb_offline(path: str | os.PathLike) -> RunRecord:
    """Read an offline W&B run (folder ``offline-run-*`` or its ``run-*.wandb`` file)."""
    path = str(path)
    if os.path.isdir(path):
        files = glob.glob(os.path.join(path, "run-*.wandb"))
        if not files:
            raise FileNotFoundError(f"{path}: no run-*.wandb file; point at a wandb/offline-run-* folder")
        path = files[0]
    name = group = ""
    config: dict = {}
    history = []
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            name, group = rec.run.display_name, rec.run.run_group
            config.update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            row["step"] = row.get("train/global_step", row.get("_step"))
            history.append(row)
    history = [{(k[len("train/"):] if k.startswith("train/") else k): v for k, v in r.items()} for r in history]
    return RunRecord(name=name, group=group, arm=str(config.get("arm", "?")), config=config, history=history,
                     source=f"W&B run {path!r}")


