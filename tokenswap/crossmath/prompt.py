"""Prompts for the three equivalent CrossMath formats.

The instruction has four blocks, GENERAL + MODALITY + OUTPUT + TASK, in our own wording (the
released wording is under a non-commercial licence). The user message content is the
instruction text, then the markdown table (text and image+text), then the image (image and
image+text), in one user turn.
"""

from __future__ import annotations

from typing import Literal

from PIL import Image

__all__ = ["MODALITIES", "Modality", "build_instruction", "build_messages", "build_user_content"]

Modality = Literal["text", "image", "image+text"]
MODALITIES: tuple[Modality, ...] = ("text", "image", "image+text")

GENERAL = (
    "You are solving a cross math puzzle. The puzzle is a grid: some cells hold numbers, some hold an "
    "operator (+, -, × or ÷) or an equals sign (=), and some are blank cells whose numbers you must find. "
    "The cells form equations of the form a op b = c that read from left to right along a row or from top "
    "to bottom along a column. Where a row equation crosses a column equation, both use the number in the "
    "shared cell. Find the number that belongs in every blank cell so that all equations in the grid are true."
)

MODALITY = {
    "text": (
        "The grid is written as a markdown table, one table row per grid row. A table cell holds a number, an "
        "operator, =, a ? for a blank cell, or nothing for an unused cell. An equation is any unbroken "
        "horizontal or vertical run of filled cells that contains =."
    ),
    "image": (
        "The grid is shown as an image. Read the arrangement of the cells and the symbols inside them from the "
        "picture: blank cells are drawn as empty boxes, and an equation is any unbroken horizontal or vertical "
        "run of drawn cells that contains =."
    ),
    "image+text": (
        "The same grid is given twice: as an image and as a markdown table with one table row per grid row. "
        "Use the image to see how the cells are arranged and the table to read their exact contents. Blank "
        "cells are empty boxes in the image and ? in the table; an equation is any unbroken horizontal or "
        "vertical run of filled cells that contains =."
    ),
}

OUTPUT = (
    "Reason through the puzzle step by step. Then write the final answer between <answer> and </answer>: "
    "the numbers of the blank cells only, ordered row by row from the top, and from left to right within a "
    "row, separated by single spaces. Put nothing else inside the tags and write nothing after them. "
    "Example: <answer>12 7 30</answer>"
)

TASK = "The puzzle to solve:"


def build_instruction(modality: Modality) -> str:
    """The instruction text (GENERAL, MODALITY, OUTPUT and TASK blocks, one per paragraph).

    Raises:
        ValueError: if ``modality`` is not ``text``, ``image`` or ``image+text``.
    """
    if modality not in MODALITY:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return "\n\n".join((GENERAL, MODALITY[modality], OUTPUT, TASK))


def build_user_content(
    modality: Modality, markdown_table: str | None = None, image: Image.Image | None = None
) -> list[dict]:
    """The content list of the single user message.

    Args:
        modality: ``text``, ``image`` or ``image+text``.
        markdown_table: the puzzle in the text format; needed for ``text`` and ``image+text``.
        image: the rendered puzzle; needed for ``image`` and ``image+text``.

    Returns:
        ``[{"type": "text", "text": instruction}, {"type": "text", "text": table}?, {"type": "image", "image": img}?]``.

    Raises:
        ValueError: if the modality is unknown or the part it needs is missing.
    """
    content = [{"type": "text", "text": build_instruction(modality)}]
    if modality in ("text", "image+text"):
        if markdown_table is None:
            raise ValueError(f"modality {modality!r} needs markdown_table; pass the record's markdown_table")
        # The official inference script sends the table exactly as the record holds it.
        content.append({"type": "text", "text": markdown_table})
    if modality in ("image", "image+text"):
        if image is None:
            raise ValueError(f"modality {modality!r} needs an image; render one or load the record's img_blank")
        content.append({"type": "image", "image": image})
    return content


def build_messages(
    modality: Modality, markdown_table: str | None = None, image: Image.Image | None = None
) -> list[dict]:
    """``[{"role": "user", "content": build_user_content(...)}]``, ready for ``apply_chat_template``."""
    return [{"role": "user", "content": build_user_content(modality, markdown_table, image)}]
