"""Rendered images (size, colours per style) and the prompt structure."""

from __future__ import annotations

import pytest
from PIL import Image

from tokenswap.crossmath import CELL_PX, STYLES, build_instruction, build_messages, build_user_content, render_grid

GRID = [
    ["12", "+", "?", "=", "20"],
    ["", "", "×", "", "÷"],
    ["", "", "3", "", "?"],
    ["", "", "=", "", "="],
    ["", "", "?", "", "5"],
    ["", "", "", "", ""],
    ["", "", "", "", ""],
]
EXPECTED = {
    # style: (background, given, operator, blank, border or None)
    "original": ((255, 255, 255), (218, 232, 245), (255, 249, 218), (255, 255, 255), (0, 0, 0)),
    "noborder": ((255, 255, 255), (218, 232, 245), (255, 249, 218), (245, 245, 245), None),
    "beige": ((249, 244, 232), (218, 232, 245), (255, 249, 218), (255, 255, 255), (0, 0, 0)),
    "altstyle": ((253, 245, 230), (216, 191, 216), (255, 228, 181), (255, 250, 250), (92, 64, 51)),
}


def origin(r: int, c: int) -> tuple[int, int]:
    return c * CELL_PX, r * CELL_PX


@pytest.mark.parametrize("style", sorted(EXPECTED))
def test_image_size_and_colours(style):
    background, given, operator, blank, border = EXPECTED[style]
    image = render_grid(GRID, style)
    assert image.mode == "RGB" and image.size == (55 * 5, 55 * 7)
    px = image.load()
    inset = 8  # inside any border, away from the centred glyph
    x, y = origin(0, 0)
    assert px[x + inset, y + inset] == given
    x, y = origin(0, 1)
    assert px[x + inset, y + inset] == operator
    x, y = origin(0, 2)  # a blank: an empty box, no glyph anywhere inside
    inner = {px[i, j] for i in range(x + 4, x + CELL_PX - 4) for j in range(y + 4, y + CELL_PX - 4)}
    assert inner == {blank}
    x, y = origin(2, 0)  # an empty cell is background
    assert px[x + CELL_PX // 2, y + CELL_PX // 2] == background
    x, y = origin(6, 4)
    assert px[x + 1, y + 1] == background
    x, y = origin(0, 0)
    edge = px[x, y + CELL_PX // 2]
    assert edge == (border if border is not None else given)
    if border is not None:
        width = STYLES[style].border_px
        assert px[x + width - 1, y + CELL_PX // 2] == border and px[x + width + 1, y + CELL_PX // 2] == given
    # The given number is drawn in the style's text colour.
    x, y = origin(0, 0)
    cell = {px[i, j] for i in range(x, x + CELL_PX) for j in range(y, y + CELL_PX)}
    assert STYLES[style].text in cell


def test_solved_image_writes_answers_into_blanks():
    image = render_grid(GRID, "original", answers={(0, 2): "8", (2, 4): "25", (4, 2): "24"})
    x, y = origin(0, 2)
    colours = {image.getpixel((i, j)) for i in range(x + 4, x + 51) for j in range(y + 4, y + 51)}
    assert (220, 0, 0) in colours
    with pytest.raises(ValueError, match="style must be one of"):
        render_grid(GRID, "neon")


def test_prompt_blocks_and_content_order():
    texts = {m: build_instruction(m) for m in ("text", "image", "image+text")}
    for text in texts.values():
        blocks = text.split("\n\n")
        assert len(blocks) == 4 and blocks[0] == texts["text"].split("\n\n")[0]
        assert "<answer>" in blocks[2] and blocks[3] == "The puzzle to solve:"
    assert "markdown table" in texts["text"] and "image" in texts["image"] and "table" in texts["image+text"]
    assert len({t.split("\n\n")[1] for t in texts.values()}) == 3

    image = Image.new("RGB", (55, 55))
    table = "| 1 | + | ? | = | 3 |"
    kinds = {m: [p["type"] for p in build_user_content(m, table, image)] for m in texts}
    assert kinds == {"text": ["text", "text"], "image": ["text", "image"], "image+text": ["text", "text", "image"]}
    hybrid = build_user_content("image+text", table, image)
    assert hybrid[1]["text"].strip() == table and hybrid[2]["image"] is image
    messages = build_messages("text", table)
    assert len(messages) == 1 and messages[0]["role"] == "user"
    with pytest.raises(ValueError, match="needs an image"):
        build_user_content("image", table)
    with pytest.raises(ValueError, match="needs markdown_table"):
        build_user_content("text", None, image)
    with pytest.raises(ValueError, match="modality must be one of"):
        build_instruction("audio")
