"""The sample schema every loader produces and TokenSwapCollator consumes."""

from __future__ import annotations

from datasets import Dataset, Features, List, Value

from tokenswap.files import iter_jsonl

__all__ = ["SAMPLE_FEATURES", "check_sample", "load_samples", "to_sample_features"]

SAMPLE_FEATURES = Features(
    {
        "id": Value("string"),
        "messages": List({"role": Value("string"), "content": Value("string")}),
        "concepts": List({"message": Value("int32"), "start": Value("int32"), "end": Value("int32"), "key": Value("string")}),
        "images": List(Value("string")),
    }
)
"""``id``; ``messages`` [{role, content}]; ``concepts`` [{message, start, end, key}]; ``images`` [path]."""


def to_sample_features(ds: Dataset) -> Dataset:
    """Add missing optional columns, drop nothing silently, and cast to :data:`SAMPLE_FEATURES`.

    Raises:
        KeyError: the dataset lacks ``id``/``messages`` or has columns outside the schema.
    """
    cols = set(ds.column_names)
    missing = {"id", "messages"} - cols
    extra = cols - set(SAMPLE_FEATURES)
    if missing or extra:
        raise KeyError(
            f"dataset columns {sorted(cols)} do not fit the sample schema: missing {sorted(missing)}, "
            f"unexpected {sorted(extra)}; map them to {list(SAMPLE_FEATURES)} (see tokenswap.data loaders)"
        )
    n = len(ds)
    if "concepts" not in cols:
        ds = ds.add_column("concepts", [[] for _ in range(n)])
    if "images" not in cols:
        ds = ds.add_column("images", [[] for _ in range(n)])
    return ds.select_columns(list(SAMPLE_FEATURES)).cast(SAMPLE_FEATURES)


def check_sample(row: object, where: str) -> None:
    """Check one sample-schema row: messages, and concept spans against their texts.

    Args:
        row: the decoded row.
        where: names the row in errors, e.g. ``"swap/part-r000-000001.jsonl line 17"``.

    Raises:
        ValueError: the row is not an object, its id is not a string or integer, its ``messages`` are not
            ``{role, content}`` with a known role and text content, or a concept span is malformed, out of range
            or overlapping (:func:`tokenswap.concepts.sample_texts`, :func:`~tokenswap.concepts.concepts_from_sample`);
            the message starts with ``where`` and the sample id.
    """
    from tokenswap.concepts import concepts_from_sample, sample_texts, text_problem

    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object per sample, got {type(row).__name__}")
    sid = row.get("id")
    if isinstance(sid, bool) or not isinstance(sid, (str, int)) or (isinstance(sid, str) and text_problem(sid)):
        why = f" ({text_problem(sid)})" if isinstance(sid, str) else ""
        raise ValueError(f"{where}: `id` must be a string or an integer, got {sid!r:.80}{why}")
    try:
        texts = sample_texts(row.get("messages"), sid)
        concepts_from_sample(row.get("concepts"), texts, sid)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


SAMPLES_FIX = "fix or delete that line, or write the file again (a swap dataset: `tokenswap build-store`)"


def _check_jsonl(path: str) -> int:
    """Validate every line of a sample JSONL file before ``datasets`` reads it; return the row count."""
    rows = 0
    for where, row in iter_jsonl(path, "sample file", SAMPLES_FIX):
        check_sample(row, where)
        rows += 1
    return rows


def load_samples(path: str, limit: int | None = None) -> Dataset:
    """Load sample-schema rows from a ``datasets`` folder, a JSONL file, or a folder of JSONL shards.

    Every row is checked first (:func:`check_sample`), so a bad span or a torn line fails here
    naming its file and line (or row), not in the middle of training.

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no data.
        InputError: a line of a JSONL file that is no JSON object (names ``file:line`` and the fix).
        ValueError: a malformed row, or no rows at all.
    """
    import os

    from datasets import load_dataset, load_from_disk
    from datasets.exceptions import DatasetGenerationError

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None (all rows), got {limit}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"sample data {path} does not exist")
    is_saved = os.path.isdir(path) and (
        os.path.exists(os.path.join(path, "dataset_info.json")) or os.path.exists(os.path.join(path, "state.json"))
    )
    if is_saved:
        ds = load_from_disk(path)
        for i, row in enumerate(ds.select_columns([c for c in ("id", "messages", "concepts") if c in ds.column_names])):
            check_sample(row, f"{path} row {i}")
    else:
        files = sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(".jsonl")
        ) if os.path.isdir(path) else [path]
        if not files:
            raise FileNotFoundError(f"{path}: no .jsonl files and not a datasets folder")
        if sum(_check_jsonl(f) for f in files) == 0:
            raise ValueError(f"{path}: no samples (the JSONL files are empty)")
        try:
            ds = load_dataset("json", data_files=files, split="train")
        except DatasetGenerationError as e:
            raise ValueError(f"{path}: {e.__cause__ or e}") from None
    if len(ds) == 0:
        raise ValueError(f"{path}: no samples")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return to_sample_features(ds)
