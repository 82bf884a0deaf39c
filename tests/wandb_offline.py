"""Read a W&B offline run back, for the tests that check what a recipe logged to W&B.

``tokenswap compare`` reads recipe output folders (``log_history.json``), not W&B's private record log; turning a
``.wandb`` file into a run lives with the tests that need it (the record framing is
``tokenswap.training.tracking.wandb_records``, which the recipes use only to wait for a run's closing record).
"""

from __future__ import annotations

import glob
import json
import os

from tokenswap.compare import RunRecord
from tokenswap.training.tracking import wandb_records


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


