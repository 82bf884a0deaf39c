"""Local dataset files (parquet, JSON lines, CSV) read through ``datasets``, every refusal an :class:`InputError`.

``datasets.load_dataset`` reports a cut parquet file as ``ArrowInvalid: Parquet magic bytes not found``, a cut JSON
line as ``DatasetGenerationError: An error occurred while generating the dataset`` and a parquet file of zero rows
as ``BatchSize must be greater than 0``, none of them naming the file. :func:`load_local` names it and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tokenswap.errors import InputError
from tokenswap.files import read_jsonl

__all__ = ["BUILDERS", "load_local", "parquet_rows", "read_parquet", "root_cause"]

BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
"""File suffix -> the ``datasets`` builder that reads it."""


def root_cause(error: BaseException) -> str:
    """``Type: message`` of the innermost cause: ``datasets`` wraps the error that names the problem."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def load_local(files: Sequence[str | os.PathLike] | str | os.PathLike, split: str, what: str, fix: str):
    """``datasets.load_dataset`` over local files (one split) or a folder (``datasets`` infers its layout).

    Args:
        files: the files (one builder, from their suffix), or one folder.
        split: the split to return (a folder with one split gives that one whatever its name).
        what: how the message names the input (``"--data '/x/mmlu'"``).
        fix: what the message tells the user to do.

    Returns:
        The ``datasets.Dataset``; it has at least one row.

    Raises:
        InputError: a file that does not read (cut, overwritten, not of its suffix' format), an unknown suffix, a
            folder whose splits do not include ``split``, or no rows at all.
    """
    import datasets

    paths = [Path(files)] if isinstance(files, (str, os.PathLike)) else [Path(f) for f in files]
    if len(paths) == 1 and paths[0].is_dir():
        # datasets logs a damaged parquet file of a folder with its traceback before raising: read the footers first.
        parquet = sorted(paths[0].rglob("*.parquet"))
        if parquet and parquet_rows(parquet, what, fix) == 0:
            raise InputError(f"{what} holds no rows; {fix}")
        try:
            splits = datasets.load_dataset(str(paths[0]))
        except Exception as e:  # noqa: BLE001 - datasets raises many types for unreadable files
            raise InputError(f"{what} cannot be read ({root_cause(e)}); {fix}") from None
        if split not in splits and len(splits) != 1:
            raise InputError(f"{what} holds splits {sorted(splits)}, not {split!r}; pass one of them")
        ds = splits[split] if split in splits else next(iter(splits.values()))
    else:
        suffixes = {p.suffix for p in paths}
        if len(suffixes) != 1 or next(iter(suffixes)) not in BUILDERS:
            raise InputError(f"{what}: data files must all end in one of {sorted(BUILDERS)}, got "
                             f"{sorted(p.name for p in paths)[:5]}")
        suffix = suffixes.pop()
        if suffix == ".parquet" and parquet_rows(paths, what, fix) == 0:  # datasets: "BatchSize must be > 0"
            raise InputError(f"{what}: {', '.join(map(str, paths))} holds no rows; {fix}")
        if suffix == ".jsonl":  # datasets logs a bad line at ERROR, then raises naming neither file nor line
            for path in paths:
                read_jsonl(path, "data file", fix)
        try:
            ds = datasets.load_dataset(BUILDERS[suffix], data_files={split: [str(p) for p in paths]}, split=split)
        except Exception as e:  # noqa: BLE001 - as above
            raise InputError(f"{what} cannot be read ({root_cause(e)}); {fix}") from None
    if len(ds) == 0:
        raise InputError(f"{what} holds no rows; {fix}")
    return ds


def parquet_rows(paths: Sequence[str | os.PathLike], what: str, fix: str) -> int:
    """The rows of parquet files, from their footers (nothing is read but the metadata).

    Raises:
        InputError: a file whose footer does not read (a cut download, another format), naming it.
    """
    import pyarrow.parquet as pq

    rows = 0
    for path in paths:
        try:
            rows += pq.ParquetFile(path).metadata.num_rows
        except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError: a cut or overwritten file
            raise InputError(f"{what}: {path} cannot be read as parquet ({root_cause(e)}); {fix}") from None
    return rows


def read_parquet(paths: Sequence[str | os.PathLike], what: str, fix: str,
                 limit: int | None = None) -> tuple[list[str], list[dict], dict]:
    """``(column names, rows as dicts, the datasets features the files declare)`` of local parquet files, with
    pyarrow alone.

    ``datasets`` takes seconds to import and writes an Arrow cache of each file it loads; a command that only
    iterates rows (``tokenswap eval`` reading a bench folder) needs neither. The features are the ``huggingface``
    metadata ``datasets`` writes into the files (``{}`` when there is none), so a caller decodes a column as
    ``datasets`` would.

    Raises:
        InputError: a file that does not read, or files whose columns differ, naming them.
    """
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in paths:
        try:
            # ParquetFile rather than read_table: the latter imports pyarrow.dataset (0.3-0.6 s, for one file read).
            with pq.ParquetFile(path) as file:
                tables.append(file.read())
        except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError: a cut or overwritten file
            raise InputError(f"{what}: {path} cannot be read as parquet ({root_cause(e)}); {fix}") from None
    try:
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    except pa.ArrowInvalid as e:
        raise InputError(f"{what}: the files {[str(p) for p in paths]} have different columns "
                         f"({root_cause(e)}); {fix}") from None
    if limit is not None:
        table = table.slice(0, limit)
    meta = (table.schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(meta).get("info", {}).get("features", {}) if meta else {}
    except ValueError:
        features = {}
    return table.column_names, table.to_pylist(), features if isinstance(features, dict) else {}
