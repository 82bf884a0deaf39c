"""Multiple-choice items in text and image-interleaved form: prompts, strict-match scoring, swapping.

This is the TokenSwap-Bench task file (nanochat ``Task`` shape: :func:`evaluate` scores one
response). The zero-shot prompt and the interleaving are byte-identical to the public
lmms-eval task (``DongXzz/TokenSwap`` ``lmms_eval_tasks/tokenswap/utils.py``):

* prompt: ``"The following are multiple choice questions about {subject, _ -> space}.\\n"``
  ``"Answer the question by replying A, B, C or D.\\nQuestion: {question}\\n"`` then
  ``"{letter}. {choice}\\n"`` per choice, then ``"Answer: "``;
* interleaving: the prompt is split on ``(<image \\d+>)``; every tag becomes an image part
  (tag ``<image N>`` is image ``N`` of the item, column ``image_N`` of the dataset) and every
  non-empty remainder a text part, all in one user turn;
* scoring: the LAST match of ``(?<!\\w)([ABCD])(?=[^a-zA-Z0-9]|$|\\.)`` must equal the answer letter.
"""

from __future__ import annotations

import io
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

from PIL import Image

from tokenswap.concepts import Concept, validate_concepts
from tokenswap.data.items import IMAGE_TAG, LETTERS, MCItem, image_tags, pair_ids_match, recover_concepts

# The item type and its tag conventions belong to the data layer (loaders build them); named here as the task file uses them.
from tokenswap.images import StoredPicture
from tokenswap.inference.pictures import picture_digest
from tokenswap.store.image_store import ImageStore
from tokenswap.swap import SwapPolicy

__all__ = [
    "COT_INSTRUCTION",
    "IMAGE_TAG",
    "LETTERS",
    "STRICT_MATCH",
    "MCItem",
    "PromptMode",
    "build_conversation",
    "evaluate",
    "extract_answer",
    "format_prompt",
    "image_tags",
    "pair_ids_match",
    "recover_concepts",
    "substitute_spans",
    "swap_concepts",
]

STRICT_MATCH = re.compile(r"(?<!\w)([ABCD])(?=[^a-zA-Z0-9]|$|\.)")
# Our own chain-of-thought instruction (the release has none). It replaces the final "Answer: " so the
# model reasons first; the strict-match filter then keeps the last letter, i.e. the one after "Answer:".
COT_INSTRUCTION = (
    'Think step by step, then finish your reply with a last line of the form "Answer: X", '
    "where X is one of the letters A, B, C or D.\n"
)
PromptMode = Literal["zero_shot", "cot", "k_shot"]


def _block(item: MCItem) -> str:
    lines = [f"Question: {item.question}\n"]
    lines += [f"{string.ascii_uppercase[i]}. {c}\n" for i, c in enumerate(item.choices)]
    return "".join(lines) + "Answer: "


def _header(subject: str) -> str:
    return (
        f"The following are multiple choice questions about {' '.join(subject.split('_'))}.\n"
        "Answer the question by replying A, B, C or D.\n"
    )


def format_prompt(item: MCItem, mode: PromptMode = "zero_shot", shots: Sequence[MCItem] = ()) -> str:
    """The prompt string (tags left in place).

    Args:
        item: the question.
        mode: ``zero_shot`` (the published template), ``cot`` (zero-shot with our reasoning
            instruction instead of the final ``"Answer: "``) or ``k_shot`` (header once, then each
            shot answered, then the question).
        shots: solved examples for ``k_shot``.

    >>> item = MCItem("0", "college_biology", "Q?", ["w", "x", "y", "z"], 1)
    >>> format_prompt(item)
    'The following are multiple choice questions about college biology.\\nAnswer the question by replying A, B, C or D.\\nQuestion: Q?\\nA. w\\nB. x\\nC. y\\nD. z\\nAnswer: '
    """
    return "".join(_prompt_blocks(item, mode, shots)[0])


def _prompt_blocks(item: MCItem, mode: PromptMode, shots: Sequence[MCItem]) -> tuple[list[str], list[MCItem]]:
    # Each block's tags refer to the images of its own item (a shot's <image 1> is not the question's).
    if mode == "zero_shot":
        return [_header(item.subject) + _block(item)], [item]
    if mode == "cot":
        return [_header(item.subject) + _block(item).removesuffix("Answer: ") + COT_INSTRUCTION], [item]
    if mode == "k_shot":
        blocks = [_block(s) + f"{s.letter}\n\n" for s in shots] + [_block(item)]
        blocks[0] = _header(item.subject) + blocks[0]
        return blocks, [*shots, item]
    raise ValueError(f"prompt mode must be 'zero_shot', 'cot' or 'k_shot', got {mode!r}")


def as_rgb(image: Image.Image | bytes | StoredPicture) -> Image.Image:
    """``image`` as an RGB PIL image: the image itself when it already is one (``convert`` would copy its pixels
    for every request that shows it), never changed in place by any caller."""
    if isinstance(image, bytes):
        return Image.open(io.BytesIO(image)).convert("RGB")
    if isinstance(image, StoredPicture):
        return image.rgb()
    return image if image.mode == "RGB" else image.convert("RGB")


def image_part(picture, digest: str | None = None) -> dict:
    """A conversation's image part: the picture as RGB PIL; with its ``digest`` (under which a backend prepares it
    once per run), a :class:`tokenswap.images.StoredPicture` stays stored, for the backend to decode when it
    prepares it (once per digest where it keeps prepared pictures: openai), not once per request here."""
    if digest is None:
        return {"type": "image", "image": as_rgb(picture)}
    return {"type": "image", "image": picture if isinstance(picture, StoredPicture) else as_rgb(picture),
            "digest": digest}


def build_conversation(item: MCItem, mode: PromptMode = "zero_shot", shots: Sequence[MCItem] = (),
                       digests: bool = False) -> list[dict]:
    """One user turn with the prompt split around ``<image N>`` tags (the release's ``doc_to_messages``).

    Args:
        digests: give each image part the ``digest`` of its picture as stored
            (:func:`tokenswap.inference.pictures.picture_digest`), under which a backend prepares it once per run;
            a :class:`tokenswap.images.StoredPicture` is then left for the backend to decode.

    Returns:
        ``[{"role": "user", "content": [{"type": "text"|"image", ...}, ...]}]``; images are RGB PIL (or stored
        pictures, with ``digests``).

    Raises:
        KeyError: a tag has no image in its item; names the item, the tag and the images present.
    """
    texts, owners = _prompt_blocks(item, mode, shots)
    content: list[dict] = []
    for text, owner in zip(texts, owners):
        for part in IMAGE_TAG.split(text):
            if IMAGE_TAG.fullmatch(part):
                n = int(part[7:-1])
                if n not in owner.images:
                    raise KeyError(
                        f"item {owner.id!r}: tag {part} has no image; images present: {sorted(owner.images)} "
                        f"(tag <image N> needs images[N], column image_N in the dataset)"
                    )
                picture = owner.images[n]
                content.append(image_part(picture, picture_digest(picture) if digests else None))
            elif part:
                if content and content[-1]["type"] == "text":  # shot boundaries: one part per text run
                    content[-1] = {"type": "text", "text": content[-1]["text"] + part}
                else:
                    content.append({"type": "text", "text": part})
    return [{"role": "user", "content": content}]


def extract_answer(response: str) -> str | None:
    """The release's strict-match filter: the last standalone capital A-D, or None.

    >>> extract_answer("A) is wrong, so D"), extract_answer("the answer is b"), extract_answer("Answer: C\\n")
    ('D', None, 'C')
    """
    matches = STRICT_MATCH.findall(response)
    return matches[-1] if matches else None


def evaluate(example: MCItem, response: str) -> float:
    """1.0 if the strict-match letter of ``response`` is the item's answer, else 0.0."""
    return float(extract_answer(response) == example.letter)


# ----------------------------------------------------------------------------- span surgery


def substitute_spans(item: MCItem, replacements: Sequence[tuple[Concept, str]], **changes) -> MCItem:
    """Replace concept spans of ``[question, *choices]`` with strings (tags, captions, or "" to delete).

    Args:
        item: the text item.
        replacements: ``(concept, new text)``; ``concept.message`` 0 is the question, 1-4 the choices.
        **changes: other fields of the returned item (e.g. ``images``).

    Surrounding text is kept byte for byte; spans must not overlap.
    """
    texts = [item.question, *item.choices]
    validate_concepts([c for c, _ in replacements], texts, item.id)
    for concept, new in sorted(replacements, key=lambda r: (r[0].message, -r[0].start)):
        t = texts[concept.message]
        texts[concept.message] = t[: concept.start] + new + t[concept.end :]
    return replace(item, question=texts[0], choices=texts[1:], **changes)


def swap_concepts(
    item: MCItem,
    concepts: Sequence[Concept],
    store: ImageStore,
    policy: SwapPolicy | None = None,
    epoch: int = 0,
) -> MCItem:
    """Turn a text item into its interleaved form: swapped concept spans become ``<image N>`` tags.

    Concepts are spans of ``[question, *choices]`` (``Concept.message`` 0 = question, 1-4 =
    choices). The policy decides which are swapped and which store image each gets (pure
    functions of the item id); concepts without store images stay text. Tags are numbered 1, 2,
    ... in reading order, one per swapped span.

    Args:
        item: the text item (no tags).
        concepts: its concept spans.
        store: images by concept key.
        policy: swap decisions; default swaps every concept that has an image.
        epoch: passed to the policy.

    Returns:
        The interleaved item (``images`` holds encoded bytes, ``concepts`` the replaced text).
    """
    policy = policy or SwapPolicy()
    texts = [item.question, *item.choices]
    ordered = validate_concepts(concepts, texts, item.id)
    chosen = policy.decide(item.id, ordered, ["user"] * len(texts), epoch=epoch)
    replacements, images, names = [], {}, {}
    for k, (concept, swap) in enumerate(zip(ordered, chosen)):
        candidates = store.get(concept.key)
        if not swap or not candidates:
            continue
        n = len(images) + 1
        picked = candidates[policy.pick(item.id, k, len(candidates), epoch=epoch)]
        images[n] = picked.load_bytes()
        names[n] = texts[concept.message][concept.start : concept.end]
        replacements.append((concept, f"<image {n}>"))
    return substitute_spans(item, replacements, images=images, concepts=names)


def shots_for(shots: Mapping[str, Sequence[MCItem]], subject: str, k: int) -> list[MCItem]:
    """The first ``k`` dev examples of a subject; raises naming the subject when there are too few."""
    have = list(shots.get(subject, ()))
    if len(have) < k:
        raise KeyError(
            f"k_shot with k={k} needs {k} dev examples of subject {subject!r}, got {len(have)}; "
            "pass shots from the source's dev split (e.g. load_mmlu(split='dev')) or lower k"
        )
    return have[:k]
