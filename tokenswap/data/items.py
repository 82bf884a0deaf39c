"""A multiple-choice bench item in text or image-interleaved form: the type every loader builds and every
evaluator reads (TokenSwap-Bench, MMLU, the recognition items), with its ``<image N>`` tag conventions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image

__all__ = ["IMAGE_TAG", "LETTERS", "MCItem", "image_tags", "pair_ids_match", "recover_concepts"]

IMAGE_TAG = re.compile(r"(<image \d+>)")
LETTERS = "ABCD"


@dataclass(frozen=True)
class MCItem:
    """One multiple-choice question, in text form or interleaved form.

    In the interleaved form ``question`` and ``choices`` contain literal ``<image N>`` tags (the
    TokenSwap-Bench ``img`` convention) and ``images[N]`` is the picture for tag ``N``.

    Args:
        id: stable id (swap decisions and recognition distractors hash it).
        subject: underscored MMLU subject, e.g. ``"high_school_biology"``.
        question: question text.
        choices: the four options, in A-D order.
        answer: index of the correct option (0-3).
        images: tag number -> image (PIL, or encoded bytes decoded on use).
        concepts: tag number -> the concept text the image replaced (used by the recognition
            control; empty when unknown).
    """

    id: str
    subject: str
    question: str
    choices: list[str]
    answer: int
    images: dict[int, Image.Image | bytes] = field(default_factory=dict, compare=False)
    concepts: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.question, str):
            raise ValueError(f"item {self.id!r}: `question` must be a string, got {type(self.question).__name__}")
        if not all(isinstance(c, str) for c in self.choices):
            raise ValueError(f"item {self.id!r}: `choices` must be strings, got {[type(c).__name__ for c in self.choices]}")
        if len(self.choices) != len(LETTERS):
            raise ValueError(f"item {self.id!r}: `choices` must hold 4 options (A-D), got {len(self.choices)}")
        if not 0 <= self.answer < len(self.choices):
            raise ValueError(f"item {self.id!r}: `answer` must be in 0..3, got {self.answer}")

    @property
    def letter(self) -> str:
        """The correct answer letter."""
        return LETTERS[self.answer]

    @property
    def num_images(self) -> int:
        """Number of distinct ``<image N>`` tags in the question and choices."""
        return len(image_tags(self))


def image_tags(item: MCItem) -> list[int]:
    """Distinct tag numbers of an item in ascending order.

    >>> image_tags(MCItem("1", "x", "a <image 2> b <image 1>", ["<image 2>", "b", "c", "d"], 0))
    [1, 2]
    """
    found = IMAGE_TAG.findall(" ".join([item.question, *item.choices]))
    return sorted({int(t[7:-1]) for t in found})


def recover_concepts(text_item: MCItem, interleaved: MCItem) -> dict[int, str]:
    """Which text each ``<image N>`` tag replaced, by aligning the two forms of one item.

    TokenSwap-Bench does not ship concept names; they are needed for the recognition control.

    Returns:
        Tag number -> replaced text (first occurrence wins); tags that cannot be aligned are left out.

    >>> t = MCItem("0", "s", "Is a cat bigger than a dog?", ["yes", "no", "cat", "dog"], 0)
    >>> i = MCItem("0", "s", "Is a <image 1> bigger than a <image 2>?", ["yes", "no", "<image 1>", "dog"], 0)
    >>> recover_concepts(t, i)
    {1: 'cat', 2: 'dog'}
    """
    out: dict[int, str] = {}
    for plain, tagged in zip([text_item.question, *text_item.choices], [interleaved.question, *interleaved.choices]):
        parts = IMAGE_TAG.split(tagged)
        if len(parts) == 1:
            continue
        pattern = "".join(f"(?P<t{i}>.+?)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
        m = re.fullmatch(pattern, plain, flags=re.DOTALL)
        if m is None:
            continue
        for i in range(1, len(parts), 2):
            out.setdefault(int(parts[i][7:-1]), m.group(f"t{i}"))
    return out


def pair_ids_match(pairs: Sequence[tuple[MCItem, MCItem]]) -> None:
    """Raise if a text/interleaved pair disagrees on id, subject or answer (a misaligned bench)."""
    for text, inter in pairs:
        if (text.id, text.subject, text.answer) != (inter.id, inter.subject, inter.answer):
            raise ValueError(
                f"text item {text.id!r} ({text.subject}, answer {text.answer}) is paired with interleaved item "
                f"{inter.id!r} ({inter.subject}, answer {inter.answer}); the two configs must list the same rows "
                "in the same order"
            )
