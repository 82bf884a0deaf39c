"""LLaVA-format instruction data (``llava_v1_5_mix665k.json``) in the tokenswap sample schema.

Source format: a JSON list of ``{"id", "image"?: relative path, "conversations": [{"from":
"human"|"gpt", "value"}]}``; the first human turn carries ``<image>`` where the picture goes,
which is exactly the collator's native-image marker, so text is kept byte for byte.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from datasets import Dataset
from datasets.exceptions import DatasetGenerationError

from tokenswap.concepts import sample_texts
from tokenswap.data.schema import SAMPLE_FEATURES

__all__ = ["load_llava"]

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def _read_records(json_path: str) -> list:
    try:
        with open(json_path, encoding="utf-8") as f:
            records = json.load(f)
    except UnicodeDecodeError as e:
        raise ValueError(f"{json_path}: not UTF-8 text ({e})") from None
    except json.JSONDecodeError as e:
        empty = " (the file is empty)" if os.path.getsize(json_path) == 0 else ""
        raise ValueError(f"{json_path}: not valid JSON{empty}: {e}") from None
    if not isinstance(records, list):
        raise ValueError(f"{json_path}: expected a JSON list of LLaVA records, got {type(records).__name__}")
    if not records:
        raise ValueError(f"{json_path}: the list of LLaVA records is empty")
    return records


def _rows(json_path: str, image_root: str | None, limit: int | None, on_missing_image: str, content_key: str):
    # content_key only enters the datasets cache fingerprint (see load_llava).
    records = _read_records(json_path)
    missing: list[str] = []
    count = 0
    for i, rec in enumerate(records):
        if limit is not None and count >= limit:
            break
        if not isinstance(rec, dict):
            raise ValueError(f"{json_path} record {i}: expected an object with 'conversations', got {rec!r:.80}")
        if not isinstance(rec.get("conversations"), list):
            raise KeyError(
                f"{json_path} record {i} (id {rec.get('id')!r}) has no 'conversations' list; keys: {sorted(rec)}"
            )
        messages = []
        for t, turn in enumerate(rec["conversations"]):
            role = _ROLES.get(turn.get("from")) if isinstance(turn, dict) else None
            if role is None or not isinstance(turn.get("value"), str):
                raise ValueError(
                    f"{json_path} record {i} (id {rec.get('id')!r}) turn {t}: expected from in {sorted(_ROLES)} "
                    f"and a str value, got {turn!r}"
                )
            messages.append({"role": role, "content": turn["value"]})
        sid = str(rec.get("id", i))
        try:
            sample_texts(messages, sid)  # text a writer and a tokenizer accept (no lone surrogates), checked here
        except ValueError as e:
            raise ValueError(f"{json_path} record {i}: {e}") from None
        images = [rec["image"]] if rec.get("image") else []
        if images and not isinstance(images[0], str):
            raise ValueError(f"{json_path} record {i} (id {rec.get('id')!r}): 'image' must be a path, got {images[0]!r}")
        if images and image_root is not None and not os.path.exists(os.path.join(image_root, images[0])):
            missing.append(images[0])
            if on_missing_image == "drop":
                continue
        count += 1
        yield {"id": sid, "messages": messages, "concepts": [], "images": images}
    if missing and on_missing_image == "error":
        raise _missing_error(missing, image_root)


def _missing_error(missing: list[str], image_root: str | None) -> FileNotFoundError:
    return FileNotFoundError(
        f"{len(missing)} LLaVA images are missing under {image_root} (first: {missing[:3]}); fix image_root, "
        "download the image folders (coco/train2017, gqa/images, ocr_vqa/images, textvqa/train_images, vg/...), "
        "or set on_missing_image=drop to skip those samples"
    )


def _content_key(path: str) -> str:
    """Changes whenever the file does: edits in place (mtime, size), replacement (inode)."""
    st = os.stat(path)
    return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}"


def load_llava(
    json_path: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    limit: int | None = None,
    on_missing_image: Literal["error", "drop"] = "error",
) -> Dataset:
    """Load ``llava_v1_5_mix665k.json`` (or any file in its schema) as a memory-mapped Dataset.

    Args:
        json_path: the JSON list file.
        image_root: folder the ``image`` paths are relative to; when given, every image is
            checked to exist.
        limit: keep the first N usable records.
        on_missing_image: raise (default) or drop samples whose image file is absent.

    Returns:
        Dataset with the sample schema; ``images`` holds the relative path (resolve it with the
        collator's ``image_root``).

    Raises:
        FileNotFoundError: ``json_path`` does not exist, or images are missing (``on_missing_image="error"``).
        ValueError / KeyError: an empty or malformed file; the message names the file, record and turn.

    The Arrow cache that ``datasets`` keeps is keyed on the file's size, mtime and inode as well as
    its path, so an edited file is read again; the image check runs on every call, cached or not,
    since images can disappear after the cache was written.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None (all records), got {limit}")
    if not os.path.isfile(json_path):
        raise FileNotFoundError(f"LLaVA file {json_path} does not exist")
    json_path = str(Path(json_path).resolve())
    root = None if image_root is None else str(image_root)
    try:
        ds = Dataset.from_generator(
            _rows,
            features=SAMPLE_FEATURES,
            gen_kwargs={
                "json_path": json_path,
                "image_root": root,
                "limit": limit,
                "on_missing_image": on_missing_image,
                "content_key": _content_key(json_path),
            },
        )
    except DatasetGenerationError as e:
        # datasets wraps the generator's exception; ours already names file, record and turn.
        cause = e.__cause__ or e.__context__
        if isinstance(cause, (ValueError, KeyError, FileNotFoundError)):
            raise cause from None
        raise
    if root is not None:
        exists = [not paths or os.path.exists(os.path.join(root, paths[0])) for paths in ds["images"]]
        if not all(exists):
            if on_missing_image == "error":
                raise _missing_error([p[0] for p, ok in zip(ds["images"], exists) if not ok], root)
            ds = ds.select([i for i, ok in enumerate(exists) if ok])
    return ds
