"""Render a CrossMath grid as an image in the four released visual styles (SPECS §1.8).

Every cell is 55×55 px, so an ``R × C`` grid gives a ``55·C × 55·R`` image. Only non-empty
cells are drawn; blanks are empty boxes (no ``?`` glyph), as in the released images.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from PIL import Image, ImageDraw, ImageFont

from tokenswap.crossmath.grid import BLANK, OPERATORS

__all__ = ["CELL_PX", "STYLES", "Style", "StyleName", "render_grid"]

CELL_PX = 55
StyleName = Literal["original", "noborder", "beige", "altstyle"]
RGB = tuple[int, int, int]
_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


@dataclass(frozen=True)
class Style:
    """Colours and strokes of one visual style.

    Attributes:
        background: image background, also the colour of empty cells.
        given: fill of cells holding a given number.
        operator: fill of operator and ``=`` cells.
        blank: fill of blank cells.
        border: cell outline colour, ``None`` for no outline.
        border_px: outline width.
        text: glyph colour.
        font_file: the DejaVu font file used for glyphs.
        folder: the released data's folder name for this style.
    """

    background: RGB
    given: RGB
    operator: RGB
    blank: RGB
    border: RGB | None
    border_px: int
    text: RGB
    font_file: str
    folder: str


_BLUE, _YELLOW, _WHITE = (218, 232, 245), (255, 249, 218), (255, 255, 255)
STYLES: dict[str, Style] = {
    "original": Style(_WHITE, _BLUE, _YELLOW, _WHITE, (0, 0, 0), 2, (0, 0, 0), "DejaVuSans.ttf", "Original"),
    "noborder": Style(_WHITE, _BLUE, _YELLOW, (245, 245, 245), None, 0, (0, 0, 0), "DejaVuSans.ttf", "Noborder"),
    "beige": Style((249, 244, 232), _BLUE, _YELLOW, _WHITE, (0, 0, 0), 2, (0, 0, 0), "DejaVuSans.ttf", "Beige"),
    "altstyle": Style(
        (253, 245, 230),
        (216, 191, 216),
        (255, 228, 181),
        (255, 250, 250),
        (92, 64, 51),
        3,
        (25, 25, 112),
        "DejaVuSerif.ttf",
        "Altstyle",
    ),
}
"""The four styles by name; the keys are what ``--styles`` and ``render_grid(style=...)`` accept."""


@lru_cache(maxsize=16)
def _font(font_file: str, size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    path = _FONT_DIR / font_file
    if path.exists():
        return ImageFont.truetype(str(path), size)
    # Without fonts-dejavu-core the glyphs differ in shape, but sizes and colours stay the same.
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
            box = (x0, y0, x0 + CELL_PX - 1, y0 + CELL_PX - 1)
            if content == BLANK:
                fill = spec.blank
            elif content in OPERATORS or content == "=":
                fill = spec.operator
            else:
                fill = spec.given
            draw.rectangle(box, fill=fill, outline=spec.border, width=spec.border_px if spec.border else 0)
            text, color = content, spec.text
            if content == BLANK:
                if answers is None or (r, c) not in answers:
                    continue
                text, color = str(answers[(r, c)]), answer_color
            # Long numbers get a smaller font so three digits still fit inside the border.
            size = 26 if len(text) <= 2 else 21
            draw.text(
                (x0 + CELL_PX / 2, y0 + CELL_PX / 2), text, fill=color, font=_font(spec.font_file, size), anchor="mm"
            )
    return image
