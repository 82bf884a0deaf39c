"""MMLU (``cais/mmlu``) as :class:`~tokenswap.eval.mc.MCItem` lists.

Hub format: config ``all`` or one per subject (57) plus ``auxiliary_train``; splits ``test``,
``validation``, ``dev`` (5 per subject, the few-shot pool); features ``question`` (str),
``subject`` (str), ``choices`` (4 str), ``answer`` (ClassLabel 0-3 = A-D).
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenswap.data.items import MCItem
from tokenswap.data.local import load_local, parquet_rows, root_cause
from tokenswap.errors import InputError

__all__ = ["load_mmlu", "load_split", "local_split_files", "mmlu_shots"]

MMLU_HUB_ID = "cais/mmlu"


LOCAL_FIX = "restore or rebuild the files (a cut copy or download?)"
"""What a message about an unreadable local split file tells the user to do."""


def _layout(config: str, split: str) -> str:
    return f"lay the files out as on the hub ({config}/{split}-00000-of-00001.parquet)"


def local_split_files(path: str | os.PathLike, config: str, split: str) -> list[Path] | None:
    """The parquet files of one config/split of a local folder in the hub layout, checked to hold rows; None for a
    hub id, or a folder whose README declares its own layout (``datasets`` reads those).

    Raises:
        FileNotFoundError: a folder with neither the hub layout's files nor a README, naming the paths tried.
        InputError: files that hold no rows, or whose footers do not read, naming them.
    """
    local = Path(path)
    if not local.is_dir():
        return None
    files = sorted(local.glob(f"{config}/{split}-*.parquet")) or sorted(local.glob(f"{config}/{split}/*.parquet"))
    if not files:
        if not (local / "README.md").exists():
            raise FileNotFoundError(
                f"{local}: no {config}/{split}-*.parquet or {config}/{split}/*.parquet and no README.md declaring "
                f"configs; {_layout(config, split)}"
            )
        return None
    # datasets reads a file of zero rows as "BatchSize must be greater than 0", naming no file.
    if parquet_rows(files, f"{local} ({config}/{split})", LOCAL_FIX) == 0:
        raise InputError(f"{', '.join(map(str, files))}: no rows in {config}/{split}; the split is empty "
                         "(rebuild it, or pass another split)")
    return files


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
        InputError: a local split whose files hold no rows or do not read (a cut file), naming them.
    """
    import datasets

    local = Path(path)
    files = local_split_files(path, config, split)
    if files is not None:
        return load_local(files, split, f"{local} ({config}/{split})", LOCAL_FIX)
    if local.is_dir():
        try:  # the README declares the layout
            return datasets.load_dataset(str(path), config, split=split)
        except Exception as e:  # noqa: BLE001 - datasets raises many types; none names the config it missed
            raise InputError(f"{local} ({config}/{split}) cannot be read ({root_cause(e)}); "
                             f"{_layout(config, split)}") from None
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

    Raises:
        InputError: missing columns, or a row that is no item (names the row); see :func:`load_split`.
    """
    ds = load_split(path, subject, split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    where = f"{path} ({subject}/{split})"
    missing = {"question", "subject", "choices", "answer"} - set(ds.column_names)
    if missing:
        raise InputError(f"{where} lacks MMLU columns {sorted(missing)}; has {ds.column_names}")
    items = []
    for i, row in enumerate(ds):
        answer, choices = row["answer"], row["choices"]
        if isinstance(answer, bool) or not isinstance(answer, int):  # a letter "A", a float, a null
            raise InputError(f"{where} row {i}: `answer` must be an option index 0..3, got {answer!r}; fix or drop "
                             "that row")
        if not isinstance(choices, list):  # a string would be read as one option per character
            raise InputError(f"{where} row {i}: `choices` must be a list of 4 options, got "
                             f"{type(choices).__name__}; fix or drop that row")
        try:
            items.append(MCItem(id=f"{row['subject']}/{split}/{i}", subject=row["subject"], question=row["question"],
                                choices=choices, answer=answer))
        except ValueError as e:  # an answer out of 0..3, not 4 choices, a question that is no string
            raise InputError(f"{where} row {i}: {e}; fix or drop that row") from None
    return items


def mmlu_shots(path: str | os.PathLike = MMLU_HUB_ID, subject: str = "all") -> dict[str, list[MCItem]]:
    """The ``dev`` split grouped by subject (the k-shot pool), in file order."""
    out: dict[str, list[MCItem]] = {}
    for item in load_mmlu(path, subject, "dev"):
        out.setdefault(item.subject, []).append(item)
    return out
