"""TokenSwap-Bench (``dongx1997/TokenSwap-Bench``) as paired :class:`~tokenswap.eval.mc.MCItem` lists.

Hub format: configs ``text`` and ``img``, split ``test`` (1,516 rows, the same rows in the same
order in both configs); fields ``subject`` (underscored MMLU subject), ``question``, ``choices``
(4 str), ``answer`` (int 0-3) and image columns ``image_N`` (``datasets.Image``). In ``img`` the
question and choices hold literal ``<image N>`` tags; tag ``<image N>`` is column ``image_N``.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import replace
from typing import Literal

from tokenswap.data.items import MCItem, image_tags, pair_ids_match, recover_concepts
from tokenswap.data.local import read_parquet
from tokenswap.data.mmlu import LOCAL_FIX, load_split, local_split_files
from tokenswap.errors import InputError
from tokenswap.files import atomic_write, atomic_write_text
from tokenswap.images import StoredPicture

__all__ = ["BENCH_HOLDS", "TOKENSWAP_BENCH_HUB_ID", "load_tokenswap_bench", "load_tokenswap_bench_pairs", "write_tokenswap_bench"]

TOKENSWAP_BENCH_HUB_ID = "dongx1997/TokenSwap-Bench"
# What a valid bench is, for the message that refuses a missing or mistyped one.
BENCH_HOLDS = ("a bench folder holds text/ and img/ parquet splits in the TokenSwap-Bench hub layout (tokenswap "
               "build-bench writes one, `python -m tokenswap.testing .cache` writes .cache/tiny-bench); or pass a hub "
               f"id such as {TOKENSWAP_BENCH_HUB_ID}")
_IMAGE_COLUMN = re.compile(r"image_(\d+)$")


def load_tokenswap_bench(
    path: str | os.PathLike = TOKENSWAP_BENCH_HUB_ID,
    config: Literal["text", "img"] = "img",
    split: str = "test",
    limit: int | None = None,
    *,
    decode: bool = True,
) -> list[MCItem]:
    """One config as items with ids ``"{split}/{row}"`` (rows carry no id of their own).

    Args:
        path: hub id or a local folder in the hub layout (``img/test-*.parquet``).
        config: ``text`` or ``img``.
        split: ``test`` (a ``dev`` split, if built, serves k-shot prompts).
        limit: keep the first ``limit`` rows.
        decode: pictures as PIL images (decoded now); ``False``: each picture stored in the row as a
            :class:`tokenswap.images.StoredPicture`, checked now and decoded when a request first needs it
            (``tokenswap eval``: the first request goes out without waiting for thousands of pictures).

    Raises:
        KeyError: missing fields, or a tag whose ``image_N`` column is absent or empty in its row.
        ValueError: a row that is no valid item (an ``answer`` out of range, not 4 choices), or a tagged picture
            that does not decode; names the row.
    """
    columns, rows, decoder = _bench_rows(path, config, split, limit)
    missing = {"subject", "question", "choices", "answer"} - set(columns)
    if missing:
        raise KeyError(
            f"{path} ({config}/{split}) lacks TokenSwap-Bench fields {sorted(missing)}; has {columns}"
        )
    image_columns = {int(m.group(1)): c for c in columns if (m := _IMAGE_COLUMN.match(c))}
    items = []
    for i, row in enumerate(rows):
        if not isinstance(row["choices"], list):  # a string would be read as one option per character
            raise InputError(f"{path} ({config}/{split}) row {i}: `choices` must be a list of 4 options, got "
                             f"{type(row['choices']).__name__}; fix or drop that row")
        try:
            item = MCItem(
                id=f"{split}/{i}",
                subject=row["subject"],
                question=row["question"],
                choices=list(row["choices"]),
                answer=int(row["answer"]),
            )
        except (ValueError, TypeError) as e:  # an answer out of 0..3, three choices, a null field
            raise InputError(f"{path} ({config}/{split}) row {i}: {e}; fix or drop that row") from None
        images = {}
        for tag in image_tags(item):
            column = image_columns.get(tag)
            if column is None or row[column] is None:
                raise KeyError(
                    f"{path} ({config}/{split}) row {i}: tag <image {tag}> needs a non-empty column image_{tag}; "
                    f"image columns present: {sorted(image_columns.values())}"
                )
            value = row[column]
            if column in decoder:
                where = f"{path} ({config}/{split}) row {i}: the picture in column {column}"
                if isinstance(value, dict) and value.get("bytes") is not None:
                    # Checked now (ValueError naming it); decoded now, or when a request first needs it.
                    value = StoredPicture(value["bytes"], decoder[column], where)
                    if decode:
                        value = value.decode()
                else:
                    try:
                        value = _decode_image(value, decoder[column])
                    except Exception as e:  # noqa: BLE001 - PIL raises many kinds for a damaged file
                        raise ValueError(f"{where} does not decode ({type(e).__name__}: {e}); replace it or drop "
                                         "that row") from None
            images[tag] = value
        items.append(replace(item, images=images))
    return items


def _bench_rows(path, config: str, split: str, limit: int | None):
    """``(columns, rows, {image column: its mode or None})``: the rows with their pictures still encoded, and the
    columns ``datasets`` would decode (``Image`` features), so a picture that does not decode is named by row and
    column instead of failing the load.

    A local folder in the hub layout is read with pyarrow alone (``datasets`` takes seconds to import and caches
    a copy of every file it loads); a hub id or a README-declared layout through ``datasets``.
    """
    files = local_split_files(path, config, split)
    if files is not None:
        columns, rows, features = read_parquet(files, f"{path} ({config}/{split})", LOCAL_FIX, limit)
        decoder = {c: f.get("mode") for c, f in features.items()
                   if isinstance(f, dict) and f.get("_type") == "Image" and f.get("decode", True)}
        return columns, rows, decoder
    import datasets

    ds = load_split(path, config, split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    decoder = {}
    for column in ds.column_names:
        feature = ds.features[column]
        if _IMAGE_COLUMN.match(column) and isinstance(feature, datasets.Image) and feature.decode:
            ds = ds.cast_column(column, datasets.Image(decode=False))
            decoder[column] = feature.mode
    return ds.column_names, ds, decoder


def _decode_image(value, mode: str | None):
    """A picture that is no stored bytes: already an image, or a ``{"path"}`` that ``datasets`` decodes (a remote one
    needs its file system). Bytes are a :class:`tokenswap.images.StoredPicture`, decoded the same way."""
    if not isinstance(value, dict):
        return value  # already an image
    import datasets

    return datasets.Image(mode=mode).decode_example(value)


def load_tokenswap_bench_pairs(
    path: str | os.PathLike = TOKENSWAP_BENCH_HUB_ID, split: str = "test", limit: int | None = None, *,
    decode: bool = True,
) -> list[tuple[MCItem, MCItem]]:
    """Both configs zipped row by row: ``(text item, interleaved item)``.

    The interleaved items get ``concepts`` (the text each tag replaced) recovered by aligning the
    two forms, for the recognition control. ``decode``: as :func:`load_tokenswap_bench`.

    Raises:
        ValueError: the configs differ in length or disagree on subject/answer of a row.
    """
    text = load_tokenswap_bench(path, "text", split, limit)
    img = load_tokenswap_bench(path, "img", split, limit, decode=decode)
    if len(text) != len(img):
        raise ValueError(f"{path}: config text has {len(text)} rows in {split} but img has {len(img)}")
    pairs = [(t, replace(i, concepts=recover_concepts(t, i))) for t, i in zip(text, img)]
    pair_ids_match(pairs)
    return pairs


def _as_written(image):
    """A picture as ``datasets.Image`` encodes it: a stored one keeps its bytes as they were read."""
    return {"bytes": image.data, "path": None} if isinstance(image, StoredPicture) else image


def write_tokenswap_bench(
    pairs: list[tuple[MCItem, MCItem]], out_dir: str | os.PathLike, split: str = "test"
) -> None:
    """Write ``(text item, interleaved item)`` pairs as ``text/`` and ``img/`` parquet in the hub layout.

    The result loads with :func:`load_tokenswap_bench_pairs` (and ``datasets.load_dataset`` via the
    README's config declaration). Image columns ``image_1..image_M`` hold encoded image bytes.
    """
    from pathlib import Path

    from datasets import Dataset, Features, Image, Value
    from datasets import Sequence as HFSequence

    out = Path(out_dir)
    pair_ids_match(pairs)
    # Tags need not be contiguous (an item may show <image 1> and <image 3>): columns go up to the highest tag.
    max_images = max((max(i.images, default=0) for _, i in pairs), default=0)
    base = {"subject": Value("string"), "question": Value("string"), "choices": HFSequence(Value("string")),
            "answer": Value("int64")}

    def rows(items: list[MCItem], with_images: bool) -> list[dict]:
        out_rows = []
        for it in items:
            row = {"subject": it.subject, "question": it.question, "choices": list(it.choices), "answer": it.answer}
            if with_images:
                row.update({f"image_{n}": _as_written(it.images.get(n)) for n in range(1, max_images + 1)})
            out_rows.append(row)
        return out_rows

    img_features = Features({**base, **{f"image_{n}": Image() for n in range(1, max_images + 1)}})
    for config, items, features in (
        ("text", [t for t, _ in pairs], Features(base)),
        ("img", [i for _, i in pairs], img_features),
    ):
        (out / config).mkdir(parents=True, exist_ok=True)
        ds = Dataset.from_list(rows(items, config == "img"), features=features)
        buf = io.BytesIO()
        ds.to_parquet(buf)
        atomic_write(out / config / f"{split}-00000-of-00001.parquet", buf.getvalue())
    atomic_write_text(
        out / "README.md",
        "---\nconfigs:\n"
        f"- config_name: text\n  data_files:\n  - split: {split}\n    path: text/{split}-*.parquet\n"
        f"- config_name: img\n  data_files:\n  - split: {split}\n    path: img/{split}-*.parquet\n---\n"
        "TokenSwap-Bench layout: `text` and `img` configs, the same rows in the same order; "
        "`<image N>` tags in `img` refer to column `image_N`.\n"
    )
