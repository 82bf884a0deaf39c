"""Hostile image files for the robustness tests, made without allocating their pixels."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from tests.support import png_bomb


def bomb_png(path: Path, side: int = 30000) -> Path:
    """A PNG whose header says ``side``x``side`` grey pixels; its data are a few KB of zeros."""
    path.write_bytes(png_bomb(side, side, rows=64))  # the first rows only: the header alone must refuse it
    return path


def sliver_png(path: Path) -> Path:
    """A 1x4000 image: the Qwen-VL processor refuses aspect ratios above 200."""
    Image.new("RGB", (1, 4000), "white").save(path)
    return path


def truncated_jpeg(path: Path) -> Path:
    """The first half of a valid JPEG."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buf, format="JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return path


def hostile_files(folder: Path) -> list[Path]:
    """One file of each kind in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return [bomb_png(folder / "bomb.png"), sliver_png(folder / "sliver.png"), truncated_jpeg(folder / "cut.jpg")]
