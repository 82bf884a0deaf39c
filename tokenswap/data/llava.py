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

from tokenswap.data.schema import SAMPLE_FEATURES

__all__ = ["load_llava"]

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def _rows(json_path: str, image_root: str | None, limit: int | None, on_missing_image: str):
    with open(json_path) as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise ValueError(f"{json_path}: expected a JSON list of LLaVA records, got {type(records).__name__}")
    missing: list[str] = []
    count = 0
    for i, rec in enumerate(records):
        if limit is not None and count >= limit:
            break
        if "conversations" not in rec:
            raise KeyError(f"{json_path} record {i} (id {rec.get('id')!r}) has no 'conversations'; keys: {sorted(rec)}")
        messages = []
        for t, turn in enumerate(rec["conversations"]):
            role = _ROLES.get(turn.get("from"))
            if role is None or not isinstance(turn.get("value"), str):
                raise ValueError(
                    f"{json_path} record {i} (id {rec.get('id')!r}) turn {t}: expected from in {sorted(_ROLES)} "
                    f"and a str value, got {turn!r}"
                )
            messages.append({"role": role, "content": turn["value"]})
        images = [rec["image"]] if rec.get("image") else []
        if images and image_root is not None and not os.path.exists(os.path.join(image_root, images[0])):
            missing.append(images[0])
            if on_missing_image == "drop":
                continue
        count += 1
        yield {"id": str(rec.get("id", i)), "messages": messages, "concepts": [], "images": images}
    if missing and on_missing_image == "error":
        raise FileNotFoundError(
            f"{len(missing)} LLaVA images are missing under {image_root} (first: {missing[:3]}); fix image_root, "
            "download the image folders (coco/train2017, gqa/images, ocr_vqa/images, textvqa/train_images, vg/...), "
            "or set on_missing_image=drop to skip those samples"
        )


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
    """
    json_path = str(Path(json_path).resolve())
    return Dataset.from_generator(
        _rows,
        features=SAMPLE_FEATURES,
        gen_kwargs={
            "json_path": json_path,
            "image_root": None if image_root is None else str(image_root),
            "limit": limit,
            "on_missing_image": on_missing_image,
        },
    )
