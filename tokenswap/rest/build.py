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

import json
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from tokenswap.rest.items import RestItem, read_items, write_items
from tokenswap.rest.render import Color, parse_color, perturbation_specs, render_text

__all__ = ["BASE_VARIANT", "build_rest_dataset", "image_path"]

BASE_VARIANT = "sans_200"


def image_path(data_dir: str | Path, item_id: str, variant: str, part: str) -> Path:
    """Path of a rendering; ``part`` is ``item`` (image modality) or ``stem`` (mixed modality)."""
    return Path(data_dir) / "images" / item_id / variant / f"{part}.png"


def _save_atomic(image: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


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
        ValueError: when ``out_dir`` was built with a different source, colour or font size.
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
        old = json.loads(meta_path.read_text())
        clash = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v}
        if clash:
            raise ValueError(f"{out} was built with other settings {clash} (old, new); use a new --out folder")
    meta_path.write_text(json.dumps({**meta, **(extra_meta or {})}, indent=2))

    items_path = out / "items.jsonl"
    done = {item.id for item in read_items(items_path)} if items_path.exists() else set()
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
