"""Prompt bytes, interleaving, strict-match and span surgery against the TokenSwap-Bench release."""

from __future__ import annotations

import pytest
from PIL import Image

from tokenswap.concepts import Concept
from tokenswap.eval.mc import (
    COT_INSTRUCTION,
    MCItem,
    build_conversation,
    evaluate,
    extract_answer,
    format_prompt,
    recover_concepts,
    substitute_spans,
    swap_concepts,
)
from tokenswap.store.image_store import ImageStore, StoreWriter
from tokenswap.swap import SwapPolicy

RED, BLUE = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
TEXT = MCItem(
    "7",
    "high_school_biology",
    "Which organ pumps blood in a horse?",
    ["the heart", "the liver", "the lung", "the horse's kidney"],
    0,
)
IMG = MCItem(
    "7",
    "high_school_biology",
    "Which organ pumps blood in a <image 1>?",
    ["the <image 2>", "the liver", "the lung", "the <image 1>'s kidney"],
    0,
    {1: RED, 2: BLUE},
)


def test_zero_shot_prompt_is_byte_identical_to_release():
    expected = (
        "The following are multiple choice questions about high school biology.\n"
        "Answer the question by replying A, B, C or D.\n"
        "Question: Which organ pumps blood in a horse?\n"
        "A. the heart\nB. the liver\nC. the lung\nD. the horse's kidney\n"
        "Answer: "
    )
    assert format_prompt(TEXT) == expected


def test_interleaved_conversation_splits_on_tags_like_release():
    conv = build_conversation(IMG)
    assert len(conv) == 1 and conv[0]["role"] == "user"
    parts = conv[0]["content"]
    kinds = [p["type"] for p in parts]
    assert kinds == ["text", "image", "text", "image", "text", "image", "text"]
    assert parts[0]["text"] == (
        "The following are multiple choice questions about high school biology.\n"
        "Answer the question by replying A, B, C or D.\nQuestion: Which organ pumps blood in a "
    )
    assert parts[2]["text"] == "?\nA. the "
    assert parts[4]["text"] == "\nB. the liver\nC. the lung\nD. the "
    assert parts[6]["text"] == "'s kidney\nAnswer: "
    # tag N -> image N (the repeated <image 1> repeats the picture, as doc_to_messages does)
    assert [p["image"].getpixel((0, 0)) for p in parts if p["type"] == "image"] == [
        (255, 0, 0),
        (0, 0, 255),
        (255, 0, 0),
    ]
    assert IMG.num_images == 2


def test_tag_without_image_names_item_and_tag():
    bad = MCItem("x", "s", "a <image 3>", ["a", "b", "c", "d"], 0, {1: RED})
    with pytest.raises(KeyError, match=r"item 'x'.*<image 3>.*\[1\]"):
        build_conversation(bad)


def test_leading_tag_emits_no_empty_text_part():
    item = MCItem("x", "s", "q", ["<image 1>", "b", "c", "d"], 0, {1: RED})
    parts = build_conversation(item)[0]["content"]
    assert all(p["text"] for p in parts if p["type"] == "text")


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("The answer is B.", "B"),
        ("A) is tempting, so D", "D"),
        ("b", None),
        ("I do not know", None),
        ("Answer: C\n", "C"),
        ("B", "B"),
        ("(A) or (C)", "C"),
        ("ABCD", None),
        ("Because of X, the answer is A", "A"),
    ],
)
def test_strict_match(response, letter):
    assert extract_answer(response) == letter
    item = MCItem("1", "s", "q", ["a", "b", "c", "d"], "ABCD".index(letter) if letter else 0)
    assert evaluate(item, response) == float(letter is not None)


def test_cot_and_k_shot_prompts():
    cot = format_prompt(TEXT, "cot")
    assert cot == format_prompt(TEXT).removesuffix("Answer: ") + COT_INSTRUCTION
    shot = MCItem("s", "high_school_biology", "Shot <image 1>?", ["w", "x", "y", "z"], 2, {1: BLUE})
    k = format_prompt(IMG, "k_shot", [shot])
    assert k == (
        "The following are multiple choice questions about high school biology.\n"
        "Answer the question by replying A, B, C or D.\n"
        "Question: Shot <image 1>?\nA. w\nB. x\nC. y\nD. z\nAnswer: C\n\n"
        "Question: Which organ pumps blood in a <image 1>?\n"
        "A. the <image 2>\nB. the liver\nC. the lung\nD. the <image 1>'s kidney\nAnswer: "
    )
    # Each block's tags resolve to its own item's images: the shot's <image 1> is blue, the item's red.
    images = [
        p["image"].getpixel((0, 0))
        for p in build_conversation(IMG, "k_shot", [shot])[0]["content"]
        if p["type"] == "image"
    ]
    assert images == [(0, 0, 255), (255, 0, 0), (0, 0, 255), (255, 0, 0)]
    assert format_prompt(TEXT, "k_shot", []) == format_prompt(TEXT)


def test_swap_concepts_with_store(tmp_path):
    with StoreWriter(tmp_path) as w:
        w.add("horse", RED, source="test")
        w.add("heart", BLUE, source="test")
    store = ImageStore(tmp_path)
    concepts = [
        Concept(0, 29, 34, "horse"),
        Concept(1, 4, 9, "heart"),
        Concept(2, 4, 9, "liver"),  # no image in the store: stays text
        Concept(4, 4, 9, "horse"),
    ]
    swapped = swap_concepts(TEXT, concepts, store, SwapPolicy(seed=1))
    assert swapped.question == "Which organ pumps blood in a <image 1>?"
    assert swapped.choices == ["the <image 2>", "the liver", "the lung", "the <image 3>'s kidney"]
    assert swapped.concepts == {1: "horse", 2: "heart", 3: "horse"}
    assert sorted(swapped.images) == [1, 2, 3] and all(isinstance(b, bytes) for b in swapped.images.values())
    assert (swapped.id, swapped.answer, swapped.subject) == (TEXT.id, TEXT.answer, TEXT.subject)
    # A policy that swaps nothing returns the text item unchanged.
    assert swap_concepts(TEXT, concepts, store, SwapPolicy(swap_prob=0.0)) == TEXT


def test_substitute_spans_deletes_and_captions():
    c = [Concept(0, 29, 34, "horse"), Concept(1, 4, 9, "heart")]
    deleted = substitute_spans(TEXT, [(c[0], ""), (c[1], "")])
    assert deleted.question == "Which organ pumps blood in a ?" and deleted.choices[0] == "the "
    captioned = substitute_spans(TEXT, [(c[0], "brown pony")])
    assert captioned.question == "Which organ pumps blood in a brown pony?"
    with pytest.raises(ValueError, match="out of range"):
        substitute_spans(TEXT, [(Concept(1, 4, 99, "x"), "")])


def test_recover_concepts_aligns_forms():
    assert recover_concepts(TEXT, IMG) == {1: "horse", 2: "heart"}
