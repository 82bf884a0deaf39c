"""Renderer: deterministic, DPI-scaled, font-sensitive, REST+ variant set, size limit."""

from __future__ import annotations

import numpy as np
import pytest

from tokenswap.rest.render import cursive_font_path, parse_color, perturbation_specs, render_text, render_variants

TEXT = "Which of the following is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
needs_cursive = pytest.mark.skipif(
    cursive_font_path() is None, reason="no cursive font installed (apt-get install fonts-dancingscript)"
)


def test_render_is_deterministic():
    a, b = render_text(TEXT), render_text(TEXT)
    assert a.size == b.size
    assert a.tobytes() == b.tobytes()


def test_default_is_black_on_white():
    pixels = np.asarray(render_text(TEXT))
    colours = {tuple(p) for p in pixels.reshape(-1, 3)}
    assert (255, 255, 255) in colours and (0, 0, 0) in colours
    # Antialiasing makes greys only: every pixel has R == G == B.
    assert all(r == g == b for r, g, b in colours)


def test_image_size_scales_with_dpi():
    sizes = {dpi: render_text(TEXT, dpi=dpi).size for dpi in (50, 100, 200)}
    for dpi in (100, 200):
        for axis in (0, 1):
            ratio = sizes[dpi][axis] / sizes[50][axis]
            assert ratio == pytest.approx(dpi / 50, rel=0.1), (dpi, axis, sizes)


def test_fonts_give_different_pixels():
    sans, mono = render_text(TEXT, font="sans"), render_text(TEXT, font="mono")
    assert sans.size != mono.size or sans.tobytes() != mono.tobytes()


@needs_cursive
def test_cursive_font_differs_from_sans():
    sans, cursive = render_text(TEXT, font="sans"), render_text(TEXT, font="cursive")
    assert sans.size != cursive.size or sans.tobytes() != cursive.tobytes()


def test_cursive_falls_back_with_warning_when_missing(monkeypatch):
    from tokenswap.rest import render

    monkeypatch.setattr(render, "cursive_font_path", lambda: None)
    render.resolve_font.cache_clear()
    try:
        with pytest.warns(UserWarning, match="fonts-dancingscript"):
            image = render_text("hello", font="cursive")
        assert image.size[0] > 0
    finally:
        render.resolve_font.cache_clear()


def test_wrapping_respects_max_width():
    long = " ".join(["word"] * 200)
    image = render_text(long, dpi=100, max_width_in=3.0, margin_in=0.2)
    assert image.size[0] <= 3.0 * 100 + 2 * 20 + 1
    assert image.size[1] > image.size[0]  # wrapped onto many lines


def test_too_tall_raises_with_fix():
    with pytest.raises(ValueError, match="max_height_px"):
        render_text("\n".join(["line"] * 200), max_height_px=1000)


def test_ten_named_variants_with_configurable_colour():
    specs = perturbation_specs("blue")
    names = [s.name for s in specs]
    assert len(names) == 10 and len(set(names)) == 10
    assert {"sans_50", "mono_100", "cursive_200", "color_blue"} <= set(names)
    assert specs[-1].color == (0, 0, 255) and specs[-1].dpi == 200 and specs[-1].font == "sans"
    variants = render_variants("1A + 2B = 7", color="0,128,0")
    assert list(variants) == [s.name for s in perturbation_specs("0,128,0")]
    green = np.asarray(variants["color_0-128-0"])
    assert ((green[..., 1] > 100) & (green[..., 0] < 50)).any()
    assert variants["sans_200"].tobytes() == render_text("1A + 2B = 7").tobytes()


def test_parse_color_errors_name_the_fix():
    assert parse_color("red") == (255, 0, 0)
    with pytest.raises(ValueError, match="R,G,B"):
        parse_color("300,0,0")
