"""MMLU (``cais/mmlu``) as :class:`~tokenswap.eval.mc.MCItem` lists.

Hub format: config ``all`` or one per subject (57) plus ``auxiliary_train``; splits ``test``,
``validation``, ``dev`` (5 per subject, the few-shot pool); features ``question`` (str),
``subject`` (str), ``choices`` (4 str), ``answer`` (ClassLabel 0-3 = A-D).
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenswap.data.items import MCItem

__all__ = ["load_mmlu", "load_split", "mmlu_shots"]

MMLU_HUB_ID = "cais/mmlu"


def load_split(path: str | os.PathLike, config: str, split: str):
    """One split of one config, from a hub id or a local folder, as a ``datasets.Dataset``.

    Local folders are read in the hub repositories' layout, ``{path}/{config}/{split}-*.parquet``
    (a ``snapshot_download`` of ``cais/mmlu`` or ``dongx1997/TokenSwap-Bench``, or what
    ``tokenswap build-bench`` writes). The parquet files are named explicitly because
    ``datasets`` would otherwise read a ``dev`` file as the ``validation`` split. A local folder in
    another layout must declare its configs in a README, as on the hub.

    Args:
        path: hub id or local folder.
        config: dataset config (``all``, a subject, ``text``, ``img``).
        split: split name.

    Raises:
        FileNotFoundError: a local folder without that config/split; names the paths tried.
        ValueError: a local split whose files hold no rows.
    """
    import datasets

    local = Path(path)
    if local.is_dir():
        files = sorted(local.glob(f"{config}/{split}-*.parquet")) or sorted(local.glob(f"{config}/{split}/*.parquet"))
        if files:
            import pyarrow.parquet as pq

            # datasets reads a file of zero rows as "BatchSize must be greater than 0", naming no file.
            if all(pq.ParquetFile(f).metadata.num_rows == 0 for f in files):
                raise ValueError(f"{', '.join(map(str, files))}: no rows in {config}/{split}; the split is empty "
                                 "(rebuild it, or pass another split)")
            return datasets.load_dataset("parquet", data_files={split: [str(f) for f in files]}, split=split)
        if not (local / "README.md").exists():
            raise FileNotFoundError(
                f"{local}: no {config}/{split}-*.parquet or {config}/{split}/*.parquet and no README.md declaring "
                f"configs; lay the files out as on the hub ({config}/{split}-00000-of-00001.parquet)"
            )
    return datasets.load_dataset(str(path), config, split=split)


def load_mmlu(
    path: str | os.PathLike = MMLU_HUB_ID, subject: str = "all", split: str = "test", limit: int | None = None
) -> list[MCItem]:
    """MMLU questions as text items with ids ``"{subject}/{split}/{row}"``.

    Args:
        path: ``cais/mmlu`` or a local copy in its layout.
        subject: ``all`` or one underscored subject config.
        split: ``test``, ``validation`` or ``dev``.
        limit: keep the first ``limit`` rows.
    """
    ds = load_split(path, subject, split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    missing = {"question", "subject", "choices", "answer"} - set(ds.column_names)
    if missing:
        raise KeyError(f"{path} ({subject}/{split}) lacks MMLU columns {sorted(missing)}; has {ds.column_names}")
    return [
        MCItem(
            id=f"{row['subject']}/{split}/{i}",
            subject=row["subject"],
            question=row["question"],
            choices=list(row["choices"]),
            answer=int(row["answer"]),
        )
        for i, row in enumerate(ds)
    ]


def mmlu_shots(path: str | os.PathLike = MMLU_HUB_ID, subject: str = "all") -> dict[str, list[MCItem]]:
    """The ``dev`` split grouped by subject (the k-shot pool), in file order."""
    out: dict[str, list[MCItem]] = {}
    for item in load_mmlu(path, subject, "dev"):
        out.setdefault(item.subject, []).append(item)
    return out
