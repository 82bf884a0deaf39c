"""The forms of one bench item: the controls that say what a modality gap is made of.

Built from a ``(text item, interleaved item)`` pair whose interleaved item names the concept each ``<image N>``
tag replaced (``MCItem.concepts``: :func:`tokenswap.data.tokenswap_bench.load_tokenswap_bench_pairs` recovers
them by aligning the two configs, :func:`tokenswap.eval.mc.swap_concepts` fills them):

* ``text`` and ``interleaved``: the bench's two configs, as they are;
* ``both``: every tag ``<image N>`` becomes ``"{word} <image N>"``: the text item with every concept word kept
  and its picture inserted right after it (the visual load without a word lost; CrossMath's image+text analogue);
* ``caption``: every tag becomes the evaluated model's own caption of its picture (:data:`CAPTION_PROMPT`, one
  single-image request per distinct picture, no answer options), then the item is asked as text;
* ``rendered``: every tag's picture becomes the concept word itself rendered as text, in the image store's
  rendered-text look (:func:`tokenswap.store.sources.render_word`: black DejaVu Sans on a white 112 px square):
  reading, not recognising;
* ``recognition``: per distinct picture, the 4-way "which concept does this image show?" item of
  :func:`tokenswap.eval.recognition.recognition_items`.

``both``, ``rendered`` and ``recognition`` need every tag's concept name (:func:`missing_concepts`);
``caption`` needs the captions. Everything else is the interleaved item's own text, byte for byte.

This module and :class:`tokenswap.eval.form_runs.FormPlan` own which requests one evaluation makes, for
``tokenswap eval`` and the in-loop :class:`tokenswap.eval.gap.GapEvaluator` alike: the forms (:data:`ITEM_FORMS`,
:data:`FORMS`), the item each form asks (:func:`form_item`), and which forms an item can be asked in.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from tokenswap.errors import InputError
from tokenswap.eval.mc import IMAGE_TAG, MCItem, image_tags

__all__ = [
    "CAPTION_MAX_CHARS",
    "CAPTION_MAX_NEW_TOKENS",
    "CAPTION_PROMPT",
    "CONCEPT_FORMS",
    "ENDS",
    "FORMS",
    "IN_LOOP_FORMS",
    "ITEM_FORMS",
    "PlanError",
    "both_item",
    "caption_conversation",
    "caption_item",
    "check_plan",
    "clean_caption",
    "form_item",
    "images_sent",
    "missing_concepts",
    "parse_forms",
    "rendered_item",
    "rendered_word",
]

ENDS = ("text", "interleaved")
"""The gap's two ends: every run asks them, and an item without an answer in either leaves the gap."""
ITEM_FORMS = (*ENDS, "both", "caption", "rendered")
"""The forms asked per item, in the order results show them."""
FORMS = (*ITEM_FORMS, "recognition")
"""Every form, in the order outputs show them (``recognition`` is asked per picture, the others per item)."""
IN_LOOP_FORMS = tuple(f for f in FORMS if f != "caption")
"""The forms the in-loop evaluator can ask: every form but ``caption`` (its items wait for a generation pass)."""
CONCEPT_FORMS = ("both", "rendered", "recognition")
"""The forms that need the concept name of every tag of an item."""
CAPTION_PROMPT = "<image 1>\nDescribe this image in a few words."
"""The captioning turn (``<image 1>`` is the picture): short and neutral, no question, no answer options."""
CAPTION_MAX_NEW_TOKENS = 64
"""Token budget of a caption: a few words fit many times over, a reasoning model's think block does not."""
CAPTION_MAX_CHARS = 500
"""A caption longer than this (after whitespace is collapsed) is no short description: the items that need it are
skipped and counted, never asked with it (64 tokens of English are about 300 characters)."""


def parse_forms(text: str) -> tuple[str, ...]:
    """``--forms``: a comma list of :data:`FORMS` or ``all``, in output order; :data:`ENDS` always.

    >>> parse_forms("recognition,both"), parse_forms("all")[-2:]
    (('text', 'interleaved', 'both', 'recognition'), ('rendered', 'recognition'))
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return FORMS
    unknown = [n for n in names if n not in FORMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(FORMS)} (or all), got {text!r}"
            + (f": unknown {', '.join(map(repr, unknown))}" if unknown else "")
        )
    return order_forms(names)


def order_forms(names: Iterable[str]) -> tuple[str, ...]:
    """The forms named, with :data:`ENDS`, in :data:`FORMS` order."""
    chosen = {*ENDS, *names}
    return tuple(f for f in FORMS if f in chosen)


class PlanError(InputError):
    """Forms, prompt and scorer that cannot make one plan (one line naming the setting and the fix, exit 2)."""


def check_plan(forms: Iterable[str], prompt: str = "zero_shot", scorer: str = "generate", *,
               in_loop: bool = False) -> tuple[str, ...]:
    """The forms of one evaluation in output order, with :data:`ENDS`; :class:`PlanError` for a plan that cannot run.

    The one statement of the planner's rules, for ``tokenswap eval``, :class:`tokenswap.eval.gap.GapEvaluator` and
    the training config's ``gap_eval`` (``in_loop``: the in-loop evaluator, which cannot ask ``caption``):

    >>> check_plan(["recognition", "both"])
    ('text', 'interleaved', 'both', 'recognition')
    >>> check_plan(["both"], prompt="cot", scorer="loglik")
    Traceback (most recent call last):
    ...
    tokenswap.eval.forms.PlanError: --prompt cot needs --scorer generate (loglik reads one next token)
    """
    forms = list(forms)
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        raise PlanError(f"the forms are {', '.join(FORMS)}; got unknown {', '.join(map(repr, unknown))}")
    if in_loop and any(f not in IN_LOOP_FORMS for f in forms):
        raise PlanError("the caption form cannot run in the training loop or GapEvaluator (its items wait for the "
                        "model's captions); run `tokenswap eval --forms caption` on a checkpoint")
    ordered = order_forms(forms)
    extra = [f for f in ordered if f in ITEM_FORMS and f not in ENDS]
    if prompt == "k_shot" and extra:
        raise PlanError(f"--prompt k_shot has shots for the text and interleaved forms only, not for "
                        f"{', '.join(extra)}; drop them from --forms or use --prompt zero_shot / cot")
    if prompt == "cot" and scorer != "generate":
        raise PlanError("--prompt cot needs --scorer generate (loglik reads one next token)")
    return ordered


def missing_concepts(item: MCItem) -> list[int]:
    """The tags of ``item`` whose concept name is unknown (the two configs of a bench row did not align there)."""
    return [tag for tag in image_tags(item) if not str(item.concepts.get(tag, "")).strip()]


def _retag(item: MCItem, new: Mapping[int, str], **changes) -> MCItem:
    """``item`` with every ``<image N>`` occurrence replaced by ``new[N]`` (the rest of the text byte for byte)."""

    def sub(text: str) -> str:
        return "".join(new[int(p[7:-1])] if IMAGE_TAG.fullmatch(p) else p for p in IMAGE_TAG.split(text))

    return replace(item, question=sub(item.question), choices=[sub(c) for c in item.choices], **changes)


def _names(item: MCItem) -> dict[int, str]:
    missing = missing_concepts(item)
    if missing:
        raise ValueError(f"item {item.id!r}: tags {missing} have no concept name; see missing_concepts")
    return {tag: item.concepts[tag] for tag in image_tags(item)}


def both_item(inter: MCItem) -> MCItem:
    """The ``both`` form: each tag ``<image N>`` becomes ``"{concept word} <image N>"``, pictures unchanged.

    >>> i = MCItem("0", "s", "Is a <image 1> big?", ["yes", "<image 1>", "c", "d"], 0, {1: b""}, {1: "cat"})
    >>> both = both_item(i); both.question, both.choices[1]
    ('Is a cat <image 1> big?', 'cat <image 1>')
    """
    return _retag(inter, {tag: f"{name} <image {tag}>" for tag, name in _names(inter).items()})


@functools.lru_cache(maxsize=4096)
def rendered_word(word: str):
    """The word rendered in the image store's rendered-text look (the same renderer, the same defaults)."""
    from tokenswap.store.sources import render_word

    return render_word(word)


def rendered_item(inter: MCItem) -> MCItem:
    """The ``rendered`` form: the same tags, each showing a picture of its concept word rendered as text."""
    names = _names(inter)
    return replace(inter, images={tag: rendered_word(name) for tag, name in names.items()})


def caption_item(inter: MCItem, captions: Mapping[int, str]) -> MCItem:
    """The ``caption`` form: every tag replaced by the caption of its picture (``captions[N]``), asked as text.

    >>> i = MCItem("0", "s", "Is a <image 1> big?", ["yes", "no", "c", "d"], 0, {1: b""}, {1: "cat"})
    >>> caption_item(i, {1: "small grey cat"}).question
    'Is a small grey cat big?'
    """
    return _retag(inter, {tag: captions[tag] for tag in image_tags(inter)}, images={}, concepts={})


_MARKUP = re.compile(r"<\|[^<>|\s]{1,40}\|>")


def clean_caption(reply: str | None) -> tuple[str | None, str | None]:
    """``(caption, None)`` for a usable caption reply, ``(None, why not)`` for an empty or absurdly long one.

    Chat-template control tokens typed out in the reply (``<|vision_end|>``: a server that does not skip special
    tokens when it decodes returns them) go, since inside the item's prompt they would be read as markup; whitespace
    runs (newlines included: a caption goes inside one prompt line) become one space, and one trailing period goes
    (the caption sits inside a sentence).

    A caption holding an image tag (``<image 1> next to <image 2>``) is refused with its reason: inside the item
    the tag would ask for a picture.

    >>> clean_caption("  A red\\n apple<|im_end|>. "), clean_caption(""), clean_caption("x" * 501)[1]
    (('A red apple', None), (None, 'the caption is empty'), 'the caption is 501 characters, more than 500')
    >>> clean_caption("<image 1> next to <|image_pad|>{}")
    (None, 'the caption holds an image tag (<image 1>)')
    """
    text = " ".join(_MARKUP.sub("", reply or "").split())
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    if not text:
        return None, "the caption is empty"
    if tag := IMAGE_TAG.search(text):
        # Inside the item's text the tag would ask for a picture the caption form does not send: the model's text is
        # data, never markup, so the caption is left out of its form (counted), and a recorded one never crashes.
        return None, f"the caption holds an image tag ({tag.group(0)})"
    if len(text) > CAPTION_MAX_CHARS:
        return None, f"the caption is {len(text)} characters, more than {CAPTION_MAX_CHARS}"
    return text, None


def form_item(form: str, text: MCItem, inter: MCItem, captions: Mapping[int, str] | None = None) -> MCItem:
    """The item asked in ``form`` for the pair ``(text, inter)``; ``captions`` (tag -> caption) for ``caption``.

    >>> i = MCItem("0", "s", "Is a <image 1> big?", ["yes", "no", "c", "d"], 0, {1: b""}, {1: "cat"})
    >>> t = MCItem("0", "s", "Is a cat big?", ["yes", "no", "c", "d"], 0)
    >>> form_item("text", t, i) is t, form_item("both", t, i).question
    (True, 'Is a cat <image 1> big?')
    """
    if form == "text":
        return text
    if form == "interleaved":
        return inter
    if form == "both":
        return both_item(inter)
    if form == "rendered":
        return rendered_item(inter)
    if form == "caption":
        if captions is None:
            raise ValueError("the caption form needs the captions of the item's pictures")
        return caption_item(inter, captions)
    raise ValueError(f"{form!r} is no item form; the item forms are {', '.join(ITEM_FORMS)}")


def caption_conversation(image, digest: str | None = None) -> list[dict]:
    """The captioning request for one picture: the picture, then :data:`CAPTION_PROMPT`'s text (one user turn).

    ``digest`` (the picture's, when the caller has it) lets a backend prepare the picture once per run.
    """
    from tokenswap.eval.mc import image_part

    text = CAPTION_PROMPT.split("<image 1>", 1)[1]
    return [{"role": "user", "content": [image_part(image, digest), {"type": "text", "text": text}]}]


def images_sent(prompt: str) -> int:
    """Image parts a formatted prompt sends: every tag occurrence (a repeated tag is sent each time)."""
    return len(IMAGE_TAG.findall(prompt))
