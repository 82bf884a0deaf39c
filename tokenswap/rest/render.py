"""Render text as an image (REST): white page, black DejaVu Sans at 200 DPI, word-wrapped.

All geometry is in physical units (points for the font, inches for width and margins) and
converted to pixels with the DPI, so the same text at 50/100/200 DPI gives images whose sides
scale (approximately) linearly with the DPI — exactly what the REST+ resolution axis varies.

Size limit: an image taller than ``max_height_px`` raises ``ValueError`` rather than being
downscaled, because silent downscaling would change the effective DPI and confound the
resolution analysis. REST drops items over 800 characters, which stay far below the limit.

Fonts: ``"sans"`` (DejaVu Sans) and ``"mono"`` (DejaVu Sans Mono) come from the system or,
failing that, from the copies matplotlib ships, so they are always available offline.
``"cursive"`` needs a script font installed on the system (Debian ``fonts-dancingscript``
gives Dancing Script); without one the renderer warns once and falls back to DejaVu Sans
Oblique. ``TOKENSWAP_CURSIVE_FONT=/path/to/font.ttf`` overrides the search.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from PIL import Image, ImageDraw, ImageFont

__all__ = [
    "DEFAULT_DPI",
    "FontName",
    "RenderSpec",
    "cursive_font_path",
    "parse_color",
    "perturbation_specs",
    "render_text",
    "render_variants",
    "resolve_font",
]

FontName = Literal["sans", "mono", "cursive"]
Color = tuple[int, int, int]

DEFAULT_DPI = 200
REST_PLUS_DPIS = (50, 100, 200)
REST_PLUS_FONTS: tuple[FontName, ...] = ("sans", "mono", "cursive")

_SYSTEM_FONT_DIRS = [
    Path("/usr/share/fonts"),
    Path("/usr/local/share/fonts"),
    Path.home() / ".fonts",
    Path.home() / ".local/share/fonts",
]
_DEJAVU_FILES = {"sans": "DejaVuSans.ttf", "mono": "DejaVuSansMono.ttf", "oblique": "DejaVuSans-Oblique.ttf"}
# Handwriting/script fonts packaged by Debian, in order of preference (all OFL/GPL, Latin coverage).
_CURSIVE_FILES = [
    "DancingScript-Regular.otf",  # fonts-dancingscript
    "DancingScript-Regular.ttf",
    "Kristi.ttf",  # fonts-kristi
    "dkg-handwriting.ttf",  # fonts-dkg-handwriting
    "Humor-Sans.ttf",  # fonts-humor-sans
]
_COLORS: dict[str, Color] = {
    "black": (0, 0, 0),
    "red": (255, 0, 0),
    "green": (0, 160, 0),
    "blue": (0, 0, 255),
    "yellow": (230, 190, 0),
}


def _find_file(names: list[str]) -> Path | None:
    for name in names:
        for root in _SYSTEM_FONT_DIRS:
            if root.is_dir():
                hit = next(iter(sorted(root.rglob(name))), None)
                if hit is not None:
                    return hit
    return None


@cache
def _dejavu(kind: str) -> Path:
    name = _DEJAVU_FILES[kind]
    system = Path("/usr/share/fonts/truetype/dejavu") / name
    if system.exists():
        return system
    found = _find_file([name])
    if found is not None:
        return found
    import matplotlib

    bundled = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name
    if bundled.exists():
        return bundled
    raise FileNotFoundError(f"{name} not found; install Debian `fonts-dejavu-core` or matplotlib")


@cache
def cursive_font_path() -> Path | None:
    """The cursive/handwriting font file, or None when no such font is installed."""
    env = os.environ.get("TOKENSWAP_CURSIVE_FONT")
    if env:
        if not Path(env).exists():
            raise FileNotFoundError(f"TOKENSWAP_CURSIVE_FONT={env!r} does not exist; point it at a .ttf/.otf file")
        return Path(env)
    return _find_file(_CURSIVE_FILES)


@cache
def resolve_font(font: str) -> Path:
    """Font file for ``"sans"``, ``"mono"``, ``"cursive"`` or a path to a .ttf/.otf file.

    Raises:
        FileNotFoundError: for a path that does not exist.
    """
    if font in ("sans", "mono"):
        return _dejavu(font)
    if font == "cursive":
        path = cursive_font_path()
        if path is None:
            # lru_cache makes this warning fire once per process.
            warnings.warn(
                "no cursive font found (install Debian `fonts-dancingscript` or set TOKENSWAP_CURSIVE_FONT); "
                "falling back to DejaVu Sans Oblique",
                stacklevel=2,
            )
            return _dejavu("oblique")
        return path
    path = Path(font)
    if not path.exists():
        raise FileNotFoundError(f"font {font!r} is neither 'sans', 'mono', 'cursive' nor an existing font file")
    return path


def parse_color(color: str | Color) -> Color:
    """``"red"`` / ``"255,0,0"`` / ``(255, 0, 0)`` -> an RGB tuple."""
    if isinstance(color, tuple):
        rgb = color
    elif color in _COLORS:
        rgb = _COLORS[color]
    else:
        try:
            rgb = tuple(int(c) for c in color.split(","))
        except ValueError:
            rgb = ()
    if len(rgb) != 3 or not all(0 <= c <= 255 for c in rgb):
        raise ValueError(f"color must be one of {sorted(_COLORS)} or 'R,G,B' with 0-255 values, got {color!r}")
    return rgb  # type: ignore[return-value]


def _wrap(text: str, font: ImageFont.FreeTypeFont, max_width: float) -> list[str]:
    """Greedy word wrap; explicit newlines start new lines; over-long words are split by character."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}" if line else word
            if font.getlength(candidate) <= max_width:
                line = candidate
                continue
            if line:
                lines.append(line)
            line = ""
            for ch in word:
                if line and font.getlength(line + ch) > max_width:
                    lines.append(line)
                    line = ""
                line += ch
        lines.append(line)
    return lines


def render_text(
    text: str,
    font: FontName | str = "sans",
    dpi: int = DEFAULT_DPI,
    color: str | Color = (0, 0, 0),
    font_size_pt: float = 12.0,
    max_width_in: float = 6.5,
    max_height_px: int = 4000,
    margin_in: float = 0.2,
    line_spacing: float = 1.25,
) -> Image.Image:
    """Render ``text`` on a white background, word-wrapped to ``max_width_in`` inches.

    The image is as wide as its longest line (plus margins) and as tall as its lines, so short
    items make small images (fewer vision tokens). Output is a pure function of the arguments.

    Args:
        text: the text; ``\\n`` starts a new line, runs of spaces collapse at wrap points.
        font: ``"sans"`` (DejaVu Sans), ``"mono"`` (DejaVu Sans Mono), ``"cursive"`` or a font file path.
        dpi: dots per inch; the font size in pixels is ``round(font_size_pt * dpi / 72)``.
        color: text colour (name, ``"R,G,B"`` or tuple); the background is always white.
        font_size_pt: font size in points.
        max_width_in: maximum text width in inches (6.5 = a letter page with 1-inch margins).
        max_height_px: maximum image height in pixels.
        margin_in: margin on every side, in inches.
        line_spacing: line height as a multiple of the font size.

    Returns:
        An RGB ``PIL.Image``.

    Raises:
        ValueError: for a non-positive ``dpi`` or when the rendered text is taller than ``max_height_px``.
    """
    if dpi <= 0:
        raise ValueError(f"dpi must be positive, got {dpi}")
    size_px = max(1, round(font_size_pt * dpi / 72))
    face = ImageFont.truetype(str(resolve_font(font)), size_px)
    margin = round(margin_in * dpi)
    lines = _wrap(text, face, max_width_in * dpi)
    line_height = max(1, round(size_px * line_spacing))
    ascent, descent = face.getmetrics()
    text_width = max((face.getlength(line) for line in lines), default=0.0)
    width = int(round(text_width)) + 2 * margin + 1
    height = (len(lines) - 1) * line_height + ascent + descent + 2 * margin
    if height > max_height_px:
        raise ValueError(
            f"rendered text is {height} px tall at dpi={dpi} ({len(lines)} lines), "
            f"above max_height_px={max_height_px}; "
            "shorten the text, lower font_size_pt/dpi, widen max_width_in or raise max_height_px"
        )
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    fill = parse_color(color)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * line_height), line, font=face, fill=fill)
    return image


@dataclass(frozen=True, kw_only=True)
class RenderSpec:
    """One REST+ visual variant: ``render_text(text, font=font, dpi=dpi, color=color)``."""

    name: str
    """Stable variant name used in file names and reports, e.g. ``sans_200`` or ``color_red``."""
    font: FontName = "sans"
    dpi: int = DEFAULT_DPI
    color: Color = (0, 0, 0)


def perturbation_specs(color: str | Color = "red") -> list[RenderSpec]:
    """The 10 REST+ variants: fonts {sans, mono, cursive} x DPI {50, 100, 200} + one coloured variant.

    ``sans_200`` is the plain REST rendering. The coloured variant uses DejaVu Sans at 200 DPI.

    Args:
        color: text colour of the coloured variant (the paper does not confirm which; default red).
    """
    rgb = parse_color(color)
    specs = [RenderSpec(name=f"{f}_{d}", font=f, dpi=d) for f in REST_PLUS_FONTS for d in REST_PLUS_DPIS]
    label = color if isinstance(color, str) and "," not in color else "-".join(map(str, rgb))
    specs.append(RenderSpec(name=f"color_{label}", color=rgb))
    return specs


def render_variants(text: str, color: str | Color = "red", **render_kwargs) -> dict[str, Image.Image]:
    """Render ``text`` under every REST+ variant: ``{variant name: image}`` (10 entries).

    Args:
        text: the text to render.
        color: text colour of the coloured variant.
        **render_kwargs: extra :func:`render_text` arguments shared by all variants (e.g. ``font_size_pt``).
    """
    return {
        spec.name: render_text(text, font=spec.font, dpi=spec.dpi, color=spec.color, **render_kwargs)
        for spec in perturbation_specs(color)
    }
