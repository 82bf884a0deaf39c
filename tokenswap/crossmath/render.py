"""Render a CrossMath grid as an image in the four released visual styles.

The geometry and colours are measured on the released PNGs (docs/crossmath_fidelity.md):

* every cell is 55×55 px, so an ``R × C`` grid gives a ``55·C × 55·R`` image;
* each non-empty cell is a box ``(x0, y0, x0+55, y0+55)`` (both ends inclusive), drawn in
  row-major order, so neighbours overlap by one pixel: the outline (2 px Original/Beige, 3 px
  Altstyle) makes shared borders 3 px (Original/Beige) or 5 px (Altstyle) and free edges 2 or 3;
* numbers are one font size (17 px tall in Original, 18 px in Altstyle), centred horizontally, on
  one baseline 36 px below the cell top;
* blanks are empty boxes (no ``?`` glyph);
* the operators and ``=`` are drawn as the released strokes (bars and dots at sub-pixel x edges, the
  two diagonals of ``×``; every released instance of each is the same pixels), at their released ink
  boxes (Original ``=`` 12×7, ``÷`` 12×9, ``+`` 12×12, ``×`` 10×10, ``-`` 8×2): no size of the packaged
  fonts gives the released width and height of ``=`` and ``÷``;
* any other text (released puzzle 0043 prints the letter ``x`` for ``×``) is drawn like a number: number
  fill, number font and size, as the release draws it.

The released pages were rendered in a browser with Helvetica/Times-metric fonts. The closest
freely packaged faces are URW's Nimbus Sans / Nimbus Roman (Debian ``fonts-urw-base35``);
Liberation and then DejaVu are used for the numbers when those are missing, with the same sizes and
positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from tokenswap.crossmath.grid import BLANK, OPERATORS

__all__ = [
    "CELL_PX",
    "STYLES",
    "Style",
    "StyleName",
    "font_path",
    "image_names",
    "puzzle_id_from_image",
    "render_grid",
]

CELL_PX = 55
StyleName = Literal["original", "noborder", "beige", "altstyle"]
RGB = tuple[int, int, int]
_FONT_DIRS = (
    Path("/usr/share/fonts/opentype/urw-base35"),
    Path("/usr/share/fonts/truetype/liberation"),
    Path("/usr/share/fonts/truetype/liberation2"),
    Path("/usr/share/fonts/truetype/dejavu"),
)
_SANS = ("NimbusSans-Regular.otf", "LiberationSans-Regular.ttf", "DejaVuSans.ttf")
_SERIF = ("NimbusRoman-Regular.otf", "LiberationSerif-Regular.ttf", "DejaVuSerif.ttf")


@dataclass(frozen=True)
class Style:
    """Colours, strokes and type of one visual style.

    Attributes:
        background: image background, also the colour of empty cells.
        given: fill of cells holding a given number.
        operator: fill of operator and ``=`` cells.
        blank: fill of blank cells.
        border: cell outline colour, ``None`` for no outline.
        border_px: outline width of one box (shared borders are ``2 * border_px - 1``).
        text: glyph colour.
        fonts: font file names, first one found wins.
        glyphs: per glyph (``"digit"`` for numbers, ``"digit<n>"`` for ``n``-digit numbers where they differ),
            ``(font size px, baseline below the cell top px, horizontal shift px)``; fitted to the released
            PNGs with the first font of ``fonts``.
        cross: ``×`` drawn as two diagonal strokes, ``(centre x, centre y, half extent, stroke width)`` in pixels
            from the cell's top-left corner; measured on the released PNGs.
        strokes: glyphs drawn as rectangles instead of text: per glyph, ``(x0, x1, y0, y1, ink)`` in pixels
            from the cell's top-left corner, ``x`` continuous (edge pixels get their covered share), rows
            ``y0 <= y < y1`` and ``ink`` the share of the text colour a fully covered pixel gets; measured
            on the released PNGs.
        folder: the released data's folder name for this style.
        suffix: the released puzzle image is ``test_images_blank<tag>/<id>_blank<suffix>.png`` and the
            solved one ``test_images<tag>/<id><suffix>.png``, ``tag`` being ``_hr`` for Original, else ``suffix``.
    """

    background: RGB
    given: RGB
    operator: RGB
    blank: RGB
    border: RGB | None
    border_px: int
    text: RGB
    fonts: tuple[str, ...]
    glyphs: dict[str, tuple[float, int, float]]
    cross: tuple[float, float, float, float]
    strokes: dict[str, tuple[tuple[float, float, int, int, float], ...]]
    folder: str
    suffix: str


# Numbers share one size and baseline (one digit height for every digit count: 17 px Original, 18 px
# Altstyle). Each operator is sized and placed so that its ink box is the released one where the Nimbus
# glyph allows it (Original: - 8x2, + 12x12, × 10x10; Altstyle: - 7x2, + 15x15, × 11x11).
_SANS_GLYPHS = {"digit": (23.75, 36, 0.0)}
_SERIF_GLYPHS = {
    "digit": (27.25, 36, 0.5),
    "digit3": (27.25, 36, -0.25),  # three-digit numbers: fitted on their own (they sit left of the others)
}
# × is also the same pixels in every released cell: two diagonal strokes, 10x10 (Original) and 11x11 (Altstyle).
# Drawn as such they miss 21 and 6 pixels of a cell at tolerance 8, the font's glyph 61 and 59.
_SANS_CROSS = (28.0, 27.0, 4.35, 2.0)
_SERIF_CROSS = (27.6, 27.5, 5.0, 1.05)
# The straight glyphs are the same pixels in every released cell: Original/Noborder/Beige `=` 12x7 (two 2-px
# bars), `÷` 13x9 (a 2-px bar, two 2x2 dots), `+` 12x12, `-` 8x2; Altstyle `=` 15x6 and `÷` 15x10 with 1-px
# bars, `+` 15x15, `-` 7x2. No Nimbus size gives both the width and the height of `=` and `÷` (Nimbus `=` came
# out 15 wide where the release is 12) and its `+`/`-` edges blend differently, so all four are drawn as the
# released strokes.
_SANS_STROKES = {
    "+": ((27, 29, 22, 34, 1.0), (22.35, 33.7, 27, 29, 1.0)),
    "-": ((24.75, 31.25, 26, 28, 1.0),),
    "=": ((22.35, 33.7, 23, 25, 1.0), (22.35, 33.7, 28, 30, 1.0)),
    "÷": ((26.35, 28.8, 23, 25, 1.0), (21.9, 33.25, 27, 29, 1.0), (26.35, 28.8, 30, 32, 1.0)),
}
_SERIF_STROKES = {
    "+": ((27, 28.1, 22, 35, 0.95), (27, 28.1, 21, 22, 0.55), (27, 28.1, 35, 36, 0.55), (20.5, 34.7, 28, 29, 1.0)),
    "-": ((24.1, 30.9, 26, 28, 1.0),),
    "=": ((20.5, 34.7, 23, 24, 1.0), (20.5, 34.7, 28, 29, 1.0)),
    # The dots are round in the font: their middle column is 95% ink.
    "÷": ((26.5, 28.3, 22, 24, 0.95), (20.3, 34.5, 27, 28, 1.0), (26.5, 28.3, 30, 32, 0.95)),
}
_BLUE, _YELLOW, _WHITE, _BLACK = (218, 232, 245), (255, 249, 218), (255, 255, 255), (0, 0, 0)
_NOBORDER_BLANK = (245, 245, 245)
STYLES: dict[str, Style] = {
    "original": Style(
        _WHITE,
        _BLUE,
        _YELLOW,
        _WHITE,
        _BLACK,
        2,
        _BLACK,
        _SANS,
        _SANS_GLYPHS,
        _SANS_CROSS,
        _SANS_STROKES,
        "Original",
        "",
    ),
    "noborder": Style(
        _WHITE,
        _BLUE,
        _YELLOW,
        _NOBORDER_BLANK,
        None,
        0,
        _BLACK,
        _SANS,
        _SANS_GLYPHS,
        _SANS_CROSS,
        _SANS_STROKES,
        "Noborder",
        "_noborder",
    ),
    "beige": Style(
        (249, 244, 232),
        _BLUE,
        _YELLOW,
        _WHITE,
        _BLACK,
        2,
        _BLACK,
        _SANS,
        _SANS_GLYPHS,
        _SANS_CROSS,
        _SANS_STROKES,
        "Beige",
        "_hr_beige",
    ),
    "altstyle": Style(
        (253, 245, 230),
        (216, 191, 216),
        (255, 228, 181),
        (255, 250, 250),
        (92, 64, 51),
        3,
        (25, 25, 112),
        _SERIF,
        _SERIF_GLYPHS,
        _SERIF_CROSS,
        _SERIF_STROKES,
        "Altstyle",
        "_altstyle",
    ),
}
"""The four styles by name; the keys are what ``--styles`` and ``render_grid(style=...)`` accept."""


def image_names(puzzle_id: str, style: StyleName) -> tuple[str, str]:
    """``(img, img_blank)``: the released relative paths of a puzzle's solved and blank image in ``style``.

    >>> image_names("math_puzzle_0001", "beige")
    ('test_images_hr_beige/math_puzzle_0001_hr_beige.png', 'test_images_blank_hr_beige/math_puzzle_0001_blank_hr_beige.png')
    """
    suffix = STYLES[style].suffix
    tag = suffix or "_hr"
    return f"test_images{tag}/{puzzle_id}{suffix}.png", f"test_images_blank{tag}/{puzzle_id}_blank{suffix}.png"


def puzzle_id_from_image(path: str) -> str:
    """The puzzle id of a released (or our) image path, the same in every style.

    >>> [puzzle_id_from_image(p) for p in ("a/math_puzzle_0001_blank.png", "math_puzzle_0001_blank_hr_beige.png")]
    ['math_puzzle_0001', 'math_puzzle_0001']
    """
    stem = Path(path).stem
    # Longest first: "_blank_noborder" must not stop at "_noborder".
    for suffix in sorted(
        {f"_blank{s.suffix}" for s in STYLES.values()} | {s.suffix for s in STYLES.values()}, key=len
    )[::-1]:
        if suffix and stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def font_path(style: StyleName) -> Path | None:
    """The font file a style renders with on this machine (``None``: Pillow's built-in font)."""
    for name in STYLES[style].fonts:
        for folder in _FONT_DIRS:
            if (folder / name).exists():
                return folder / name
    return None


@lru_cache(maxsize=64)
def _font(style: str, size: float) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    path = font_path(style)
    if path is not None:
        return ImageFont.truetype(str(path), size)
    # Without any of the fonts the glyph shapes differ; sizes, positions and colours stay the same.
    return ImageFont.load_default(size=size)


def _cross_cover(cx: float, cy: float, half: float, width: float) -> np.ndarray:
    """Per pixel of a cell, the share an ``×`` of two diagonal strokes covers (8x8 samples per pixel)."""
    samples = 8
    ys, xs = np.mgrid[0 : CELL_PX * samples, 0 : CELL_PX * samples]
    u, v = (xs + 0.5) / samples - cx, (ys + 0.5) / samples - cy
    along, across = np.abs(u + v) / 2**0.5, np.abs(u - v) / 2**0.5
    reach = half * 2**0.5
    ink = ((across <= width / 2) & (along <= reach)) | ((along <= width / 2) & (across <= reach))
    return ink.reshape(CELL_PX, samples, CELL_PX, samples).mean((1, 3))


def _rects_cover(rects: tuple[tuple[float, float, int, int, float], ...]) -> np.ndarray:
    """Per pixel of a cell, the share the rectangles cover (edge columns get their covered share)."""
    cover = np.zeros((CELL_PX, CELL_PX))
    for left, right, top, bottom, ink in rects:
        for x in range(int(left), int(right) + 1):
            share = ink * (min(right, x + 1) - max(left, x))
            cover[top:bottom, x] = np.maximum(cover[top:bottom, x], share)
    return cover


@lru_cache(maxsize=32)
def _stroke_mask(style: str, text: str) -> tuple[Image.Image, tuple[int, int]]:
    """The coverage of a stroke-drawn glyph as an ``L`` mask cropped to its ink, and its offset in the cell."""
    spec = STYLES[style]
    cover = _cross_cover(*spec.cross) if text == "×" else _rects_cover(spec.strokes[text])
    ys, xs = np.nonzero(cover)
    crop = cover[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    return Image.fromarray(np.round(255 * crop).astype(np.uint8), "L"), (int(xs.min()), int(ys.min()))


def render_grid(
    grid: list[list[str]],
    style: StyleName = "original",
    answers: dict[tuple[int, int], str] | None = None,
    answer_color: RGB = (220, 0, 0),
) -> Image.Image:
    """Draw a puzzle grid.

    Args:
        grid: cell contents (numbers, ``?``, operators, ``=``, ``""``); any other text (the ``x`` of released
            puzzle 0043's raw markdown) is drawn like a number, in the number fill, as the release draws it.
        style: one of :data:`STYLES`.
        answers: optional ``{(row, col): value}`` written into blank cells (the solved image).
        answer_color: glyph colour of filled-in answers (the paper marks solutions in red).

    Returns:
        An RGB image of ``55·cols × 55·rows`` pixels.

    Raises:
        ValueError: if ``style`` is unknown.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {sorted(STYLES)}, got {style!r}")
    spec = STYLES[style]
    rows, cols = len(grid), len(grid[0])
    image = Image.new("RGB", (CELL_PX * cols, CELL_PX * rows), spec.background)
    draw = ImageDraw.Draw(image)
    for r, row in enumerate(grid):
        for c, content in enumerate(row):
            if not content:
                continue
            x0, y0 = c * CELL_PX, r * CELL_PX
            if content == BLANK:
                fill = spec.blank
            elif content in OPERATORS or content == "=":
                fill = spec.operator
            else:
                fill = spec.given
            # One pixel wider than the pitch: the released boxes overlap their neighbours by one pixel.
            box = (x0, y0, x0 + CELL_PX, y0 + CELL_PX)
            draw.rectangle(box, fill=fill, outline=spec.border, width=spec.border_px if spec.border else 0)
            text, color = content, spec.text
            if content == BLANK:
                if answers is None or (r, c) not in answers:
                    continue
                text, color = str(answers[(r, c)]), answer_color
            if text == "×" or text in spec.strokes:
                mask, (dx, dy) = _stroke_mask(style, text)
                image.paste(color, (x0 + dx, y0 + dy, x0 + dx + mask.width, y0 + dy + mask.height), mask)
                continue
            if text in spec.glyphs:
                key = text
            elif f"digit{len(text)}" in spec.glyphs and text.isdigit():
                key = f"digit{len(text)}"
            else:
                key = "digit"
            size, baseline, shift = spec.glyphs[key]
            font = _font(style, size)
            draw.text((x0 + CELL_PX / 2 + shift, y0 + baseline), text, fill=color, font=font, anchor="ms")
    return image
