"""Render a CrossMath grid as an image in the four released visual styles.

The geometry and colours are measured on the released PNGs (docs/crossmath_fidelity.md):

* every cell is 55×55 px, so an ``R × C`` grid gives a ``55·C × 55·R`` image;
* each non-empty cell is a box ``(x0, y0, x0+55, y0+55)`` (both ends inclusive), drawn in
  row-major order, so neighbours overlap by one pixel: the outline (2 px Original/Beige, 3 px
  Altstyle) makes shared borders 3 px (Original/Beige) or 5 px (Altstyle) and free edges 2 or 3;
* every glyph is one font size (numbers 17 px tall in Original, 18 px in Altstyle), centred
  horizontally, on one baseline 36 px below the cell top; with that font size the operators
  come out as released (``+`` 12×12, ``×`` 10×10, ``÷`` 12 wide × 9 tall in Original);
* blanks are empty boxes (no ``?`` glyph).

The released pages were rendered in a browser with Helvetica/Times-metric fonts. The closest
freely packaged faces are URW's Nimbus Sans / Nimbus Roman (Debian ``fonts-urw-base35``);
Liberation and then DejaVu are used when those are missing, with the same sizes and positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

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
    folder: str
    suffix: str


# Numbers share one size and baseline (one digit height for every digit count: 17 px Original, 18 px
# Altstyle). Each operator is sized and placed so that its ink box is the released one where the Nimbus
# glyph allows it (Original: - 8x2, + 12x12, × 10x10; Altstyle: - 7x2, + 15x15, × 11x11) and otherwise
# for the most pixels within tolerance (=, ÷: Nimbus has no size giving the released 12x7 and 12x9).
_SANS_GLYPHS = {
    "digit": (23.5, 36, 0.0),
    "-": (29, 35, 0.0),
    "+": (23, 34, 0.0),
    "=": (29, 33, 0.0),
    "×": (25, 33, 0.0),
    "÷": (19, 32, 0.0),
}
_SERIF_GLYPHS = {
    "digit": (27, 36, 0.5),
    "digit3": (27, 36, -0.5),  # three-digit numbers sit half a pixel left of the others
    "-": (28, 33, 0.0),
    "+": (29, 36, -1.0),
    "=": (23, 32, 0.0),
    "×": (22, 33, -1.0),
    "÷": (19, 32, -1.0),
}
_BLUE, _YELLOW, _WHITE, _BLACK = (218, 232, 245), (255, 249, 218), (255, 255, 255), (0, 0, 0)
_NOBORDER_BLANK = (245, 245, 245)
STYLES: dict[str, Style] = {
    "original": Style(_WHITE, _BLUE, _YELLOW, _WHITE, _BLACK, 2, _BLACK, _SANS, _SANS_GLYPHS, "Original", ""),
    "noborder": Style(
        _WHITE, _BLUE, _YELLOW, _NOBORDER_BLANK, None, 0, _BLACK, _SANS, _SANS_GLYPHS, "Noborder", "_noborder"
    ),
    "beige": Style(
        (249, 244, 232), _BLUE, _YELLOW, _WHITE, _BLACK, 2, _BLACK, _SANS, _SANS_GLYPHS, "Beige", "_hr_beige"
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


def render_grid(
    grid: list[list[str]],
    style: StyleName = "original",
    answers: dict[tuple[int, int], str] | None = None,
    answer_color: RGB = (220, 0, 0),
) -> Image.Image:
    """Draw a puzzle grid.

    Args:
        grid: cell contents (numbers, ``?``, operators, ``=``, ``""``).
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
            key = (
                text if not text.isdigit() else f"digit{len(text)}" if f"digit{len(text)}" in spec.glyphs else "digit"
            )
            size, baseline, shift = spec.glyphs[key]
            font = _font(style, size)
            draw.text((x0 + CELL_PX / 2 + shift, y0 + baseline), text, fill=color, font=font, anchor="ms")
    return image
