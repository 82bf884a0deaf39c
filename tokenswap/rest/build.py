"""Write a REST dataset folder: items plus every rendering, resumable.

Layout::

    DIR/meta.json                          source, variants, colour, render settings
    DIR/items.jsonl                        one RestItem per line (text modality + gold)
    DIR/images/<item id>/<variant>/item.png  the whole item (image modality)
    DIR/images/<item id>/<variant>/stem.png  the stem (mixed modality; the query stays text)

``<variant>`` is a REST+ variant name (``sans_200`` is plain REST). An item's line is appended
only after all its images are on disk, and images are written via a temporary file, so a killed
build redoes at most the item it was on; items already listed are skipped.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from tokenswap.errors import InputError
from tokenswap.files import atomic_write, cut_torn_tail, read_json, read_json_object
from tokenswap.rest.items import RestItem, read_items, write_items
from tokenswap.rest.render import Color, parse_color, perturbation_specs, render_text

__all__ = ["BASE_VARIANT", "META_FIX", "build_rest_dataset", "image_path", "read_meta"]

BASE_VARIANT = "sans_200"


def image_path(data_dir: str | Path, item_id: str, variant: str, part: str) -> Path:
    """Path of a rendering; ``part`` is ``item`` (image modality) or ``stem`` (mixed modality)."""
    return Path(data_dir) / "images" / item_id / variant / f"{part}.png"


META_FIX = "rebuild the folder with `tokenswap rest build` (it writes meta.json)"


def read_meta(path: str | Path, what: str = "--data file") -> dict:
    """A folder's ``meta.json``, checked to hold the ``variants`` list every reader needs.

    Raises:
        InputError: the file is missing, empty, cut or not an object, or lacks a ``variants`` list of rendering
            names; names the file and the fix.
    """
    meta = read_json(path, what, META_FIX)
    variants = meta.get("variants") if isinstance(meta, dict) else None
    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
        raise InputError(f"{what} {str(path)!r} has no `variants` list of rendering names (got "
                         f"{type(variants).__name__ if variants is not None else 'none'}); {META_FIX}")
    return meta


def _save_atomic(image: Image.Image, path: Path) -> None:
    # Encoded in memory, then files.atomic_write: the writer's own temporary, fsynced, so two writers of one
    # rendering never share a temporary and a crash never leaves a torn PNG behind a finished record.
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    atomic_write(path, buf.getvalue())


def build_rest_dataset(
    items: Sequence[RestItem],
    out_dir: str | Path,
    source: str,
    color: str | Color = "red",
    font_size_pt: float = 12.0,
    extra_meta: dict | None = None,
) -> dict:
    """Render ``items`` under every REST+ variant into ``out_dir`` (skipping items already written).

    Args:
        items: items to write.
        out_dir: dataset folder (created if needed).
        source: ``mmlu``, ``arc``, ``gsm`` or ``soebench`` (recorded in meta.json).
        color: text colour of the coloured variant.
        font_size_pt: font size of every rendering.
        extra_meta: more fields for meta.json (e.g. the data path and filter counts).

    Returns:
        ``{"written": int, "skipped": int, "total": int}``.

    Raises:
        InputError: when ``out_dir`` was built with a different source, colour or font size, or its
            ``meta.json`` or ``items.jsonl`` is damaged (a cut last line of ``items.jsonl`` is cut off and redone).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = perturbation_specs(color)
    meta = {
        "source": source,
        "variants": [s.name for s in specs],
        "base_variant": BASE_VARIANT,
        "color": list(parse_color(color)),
        "font_size_pt": font_size_pt,
    }
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = read_json_object(meta_path, "--out file", "it records the settings the folder was built with: restore "
                               "it, or use a new --out folder")
        clash = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v}
        if clash:
            raise InputError(f"{out} was built with other settings {clash} (old, new); use a new --out folder")
    atomic_write(meta_path, json.dumps({**meta, **(extra_meta or {})}, indent=2).encode())

    items_path = out / "items.jsonl"
    cut_torn_tail(items_path)  # a kill mid-line: that item's images are all written, it is redone whole
    fix = "fix or delete that line (the build renders its item again), or use a new --out folder"
    done = {item.id for item in read_items(items_path, fix)} if items_path.exists() else set()
    written = 0
    for item in items:
        if item.id in done:
            continue
        for spec in specs:
            for part, text in (("item", item.text), ("stem", item.stem)):
                image = render_text(text, font=spec.font, dpi=spec.dpi, color=spec.color, font_size_pt=font_size_pt)
                _save_atomic(image, image_path(out, item.id, spec.name, part))
        write_items([item], items_path, append=True)
        done.add(item.id)
        written += 1
    return {"written": written, "skipped": len(items) - written, "total": len(done)}
