"""The sample schema every loader produces and TokenSwapCollator consumes."""

from __future__ import annotations

from datasets import Dataset, Features, List, Value

__all__ = ["SAMPLE_FEATURES", "load_samples", "to_sample_features"]

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


def load_samples(path: str, limit: int | None = None) -> Dataset:
    """Load sample-schema rows from a ``datasets`` folder, a JSONL file, or a folder of JSONL shards."""
    import os

    from datasets import load_dataset, load_from_disk

    if os.path.isdir(path) and os.path.exists(os.path.join(path, "dataset_info.json")):
        ds = load_from_disk(path)
    elif os.path.isdir(path) and os.path.exists(os.path.join(path, "state.json")):
        ds = load_from_disk(path)
    else:
        files = sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(".jsonl")
        ) if os.path.isdir(path) else [path]
        if not files:
            raise FileNotFoundError(f"{path}: no .jsonl files and not a datasets folder")
        ds = load_dataset("json", data_files=files, split="train")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return to_sample_features(ds)
