"""Recognition control: can the evaluated model tell which concept each swapped image shows?

The TokenSwap paper checks image recognisability with humans and a Gemini proxy only, never
with the model whose gap it reports. For every distinct swapped picture we build a 4-choice item
("which concept does this image show?", the human check's format) whose distractors are other
concepts of the same evaluation set, chosen and ordered deterministically with
:func:`tokenswap.swap.unit_hash` from the picture's bytes and its concept name, so the same picture
gets the same item wherever it appears. The evaluator scores each distinct picture once, in naming
form and multiple-choice form (see :mod:`tokenswap.eval.gap`), reports identification accuracy
next to the gap, and a recognition-controlled gap over the items whose images were all identified.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenswap.concepts import normalize_concept
from tokenswap.eval.mc import MCItem, image_tags
from tokenswap.inference.pictures import picture_digest
from tokenswap.swap import unit_hash

__all__ = ["RECOGNITION_QUESTION", "RECOGNITION_SUBJECT", "picture_digest", "recognition_items"]

RECOGNITION_SUBJECT = "concept_identification"
RECOGNITION_QUESTION = "<image 1>\nWhich concept does this image show?"


def recognition_items(interleaved: Sequence[MCItem], seed: int = 0) -> list[tuple[int, int, MCItem]]:
    """One identification item per swapped image of each interleaved item.

    Items whose pictures have the same bytes and concept name are equal (same id, choices, answer),
    so a caller can score each distinct picture once.

    Args:
        interleaved: interleaved items with ``concepts`` filled for every tag.
        seed: changes distractor choice and answer position for all items at once.

    Returns:
        ``(index into interleaved, tag number, item)`` triples; the item's choices are normalized
        concept names, its answer the target's position, its only image the tagged one.

    Raises:
        ValueError: a tag without a concept name, or fewer than 4 distinct concepts in the set.

    >>> from PIL import Image
    >>> img = Image.new("RGB", (4, 4))
    >>> items = [MCItem(str(i), "s", f"<image 1> {i}", list("abcd"), 0, {1: img}, {1: c})
    ...          for i, c in enumerate(["cat", "dog", "apple", "car"])]
    >>> [(i, tag, r.choices[r.answer]) for i, tag, r in recognition_items(items)][:2]
    [(0, 1, 'cat'), (1, 1, 'dog')]
    """
    names: dict[tuple[int, int], str] = {}
    for i, item in enumerate(interleaved):
        for tag in image_tags(item):
            if tag not in item.concepts:
                raise ValueError(
                    f"item {item.id!r}: tag <image {tag}> has no concept name; recognition needs MCItem.concepts "
                    "(swap_concepts fills it; for a loaded bench use recover_concepts(text_item, interleaved_item))"
                )
            names[i, tag] = normalize_concept(item.concepts[tag])
    pool = sorted(set(names.values()))
    if len(pool) < 4:
        raise ValueError(f"recognition needs at least 4 distinct concepts for 4-choice items, got {len(pool)}: {pool}")
    out = []
    for (i, tag), name in names.items():
        item = interleaved[i]
        picture = f"{name}#{picture_digest(item.images[tag])}"
        others = sorted((c for c in pool if c != name), key=lambda c: unit_hash(seed, picture, c, "distractor"))
        position = int(unit_hash(seed, picture, "position") * 4)
        choices = others[:3]
        choices.insert(position, name)
        out.append(
            (
                i,
                tag,
                MCItem(
                    id=picture,
                    subject=RECOGNITION_SUBJECT,
                    question=RECOGNITION_QUESTION,
                    choices=choices,
                    answer=position,
                    images={1: item.images[tag]},
                    concepts={1: name},
                ),
            )
        )
    return out
