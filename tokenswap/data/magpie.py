"""Magpie-Pro instruction data in the swap-dataset sample schema.

Raw rows (``Magpie-Align/Magpie-Pro-300K-Filtered`` on the hub, or any local JSONL / JSON /
parquet file or folder in the same shape)::

    {"uuid": str, "conversations": [{"from": "human" | "gpt" | "system", "value": str}, ...], ...}

become samples::

    {"id": uuid, "messages": [{"role": "user" | "assistant" | "system", "content": str}],
     "concepts": [], "images": []}

Concept spans are filled later by the store build (or :func:`tokenswap.store.embedded.load_fixture` for the packaged
fixture). Other columns of the raw data are ignored.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from tokenswap.errors import InputError
from tokenswap.files import iter_jsonl

__all__ = ["MAGPIE_HUB_ID", "ROLE_MAP", "fixture_path", "iter_magpie", "magpie_to_sample"]

MAGPIE_HUB_ID = "Magpie-Align/Magpie-Pro-300K-Filtered"
ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def magpie_to_sample(row: dict[str, Any], index: int | None = None, where: str | None = None) -> dict:
    """Convert one raw Magpie row to a sample.

    Everything a later stage relies on is checked here, where the row enters: types, roles, and that every
    string is text a UTF-8 writer and a tokenizer accept (:func:`tokenswap.concepts.text_problem`).

    Args:
        row: ``{"uuid", "conversations": [{"from", "value"}]}`` (extra keys ignored).
        index: the row's position in its source, used in error messages.
        where: names the row in error messages instead of ``index`` (e.g. ``"data.jsonl:7"``).

    Raises:
        ValueError: a missing or mistyped field, or a string that is not text; the message names the row and
            the field.

    >>> magpie_to_sample({"uuid": "u1", "conversations": [{"from": "human", "value": "Hi"},
    ...                                                   {"from": "gpt", "value": "Hello"}]})["messages"]
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello'}]
    """
    from tokenswap.concepts import text_problem

    if where is None:
        where = f"Magpie row {index}" if index is not None else "Magpie row"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a dict with 'uuid' and 'conversations', got {type(row).__name__}")
    uuid = row.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"{where}: field 'uuid' must be a non-empty string, got {uuid!r}; keys are {sorted(row)}")
    if text_problem(uuid):
        raise ValueError(f"{where}: field 'uuid' {uuid!r}: {text_problem(uuid)}")
    where = f"{where} (uuid {uuid!r})"
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{where}: field 'conversations' must be a non-empty list of {{from, value}}, got {turns!r}")
    messages = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ValueError(f"{where}: conversations[{t}] must be a dict with 'from' and 'value', got {turn!r}")
        speaker, value = turn.get("from"), turn.get("value")
        if speaker not in ROLE_MAP:
            raise ValueError(
                f"{where}: conversations[{t}].from is {speaker!r}; expected one of {sorted(set(ROLE_MAP))}"
            )
        if not isinstance(value, str):
            raise ValueError(f"{where}: conversations[{t}].value must be a string, got {type(value).__name__}")
        if text_problem(value):
            raise ValueError(f"{where}: conversations[{t}].value: {text_problem(value)}")
        messages.append({"role": ROLE_MAP[speaker], "content": value})
    if not any(m["role"] == "user" for m in messages):
        raise ValueError(f"{where}: field 'conversations' has no human turn")
    return {"id": uuid, "messages": messages, "concepts": [], "images": []}


def _load_raw(path: str, split: str, streaming: bool) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each raw row; ``where`` is ``"{file}:{n}"`` for JSONL, else ``"{path} row {i}"``.

    A JSONL file is read line by line (:func:`tokenswap.files.iter_jsonl`): ``datasets``' JSON reader fails the
    whole file on one truncated or non-UTF-8 line, here such a line is one bad row (an :class:`InputError`
    yielded in its place), which :func:`iter_magpie` raises or skips and counts.
    """
    local = Path(path)
    if local.is_file() and local.suffix.lower() == ".jsonl":
        return iter_jsonl(local, "Magpie data", yield_malformed=True)
    return ((f"{path} row {i}", row) for i, row in enumerate(_load_dataset(path, split, streaming)))


def _load_dataset(path: str, split: str, streaming: bool):
    import datasets

    local = Path(path)
    if local.exists():
        if local.is_file():
            suffix = local.suffix.lower()
            builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
            if builder is None:
                raise ValueError(f"Magpie file {local} must end in .jsonl, .json or .parquet, got {suffix!r}")
            return datasets.load_dataset(builder, data_files=str(local), split="train", streaming=streaming)
        if (local / "dataset_info.json").exists() or (local / "state.json").exists():
            ds = datasets.load_from_disk(str(local))
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        return datasets.load_dataset(str(local), split=split, streaming=streaming)
    return datasets.load_dataset(path, split=split, streaming=streaming)


def iter_magpie(
    path: str = MAGPIE_HUB_ID,
    split: str = "train",
    streaming: bool = True,
    max_samples: int | None = None,
    skip_malformed: bool = False,
    stats: dict | None = None,
) -> Iterator[dict]:
    """Stream Magpie rows as samples, in source order.

    Args:
        path: hub dataset id, or a local ``.jsonl``/``.json``/``.parquet`` file, a data folder, or a
            folder written by ``save_to_disk``.
        split: split to read (local files have a single ``train`` split).
        streaming: stream instead of downloading and preparing the whole dataset first.
        max_samples: stop after this many rows; None for all.
        skip_malformed: skip malformed rows instead of raising: bad fields, strings that are not text (lone
            surrogates from ``\\udcff`` escapes), and in ``.jsonl`` files also truncated, non-UTF-8 and
            non-object lines. They still count towards
            ``max_samples`` (so the output does not depend on where they are), are counted in
            ``stats`` and reported in one warning at the end.
        stats: if given, receives ``rows`` (rows read), ``malformed`` (rows skipped) and
            ``malformed_examples`` (the first five reasons).

    Raises:
        InputError: a malformed row (names ``file:line``, or the row, the uuid and the field).
        ValueError: a source with no rows at all.
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 or None (all rows), got {max_samples}")
    stats = {} if stats is None else stats
    stats.update(rows=0, malformed=0, malformed_examples=[])
    for i, (where, row) in enumerate(_load_raw(path, split, streaming)):
        if max_samples is not None and i >= max_samples:
            break
        stats["rows"] += 1
        try:
            if isinstance(row, InputError):  # a line of a JSONL file that is no JSON object
                raise row
            sample = magpie_to_sample(row, i, where=where)
        except ValueError as e:
            if not skip_malformed:
                raise InputError(
                    f"{e}; set data.skip_malformed: true (iter_magpie: skip_malformed=True) to skip and count such rows"
                ) from None
            stats["malformed"] += 1
            if len(stats["malformed_examples"]) < 5:
                stats["malformed_examples"].append(str(e))
            continue
        yield sample
    if stats["rows"] == 0:
        raise ValueError(f"Magpie data {path} (split {split!r}) has no rows; is it the right file or split?")
    if stats["malformed"]:
        warnings.warn(
            f"{path}: skipped {stats['malformed']} malformed of {stats['rows']} rows (skip_malformed); first: "
            f"{stats['malformed_examples'][0]}",
            stacklevel=2,
        )


def fixture_path() -> Path:
    """Path of the packaged Magpie-format fixture (``tokenswap/assets/magpie_fixture.jsonl``)."""
    return Path(str(resources.files("tokenswap") / "assets" / "magpie_fixture.jsonl"))
