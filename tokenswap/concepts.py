"""Concept spans: the unit TokenSwap replaces with an image.

A concept is a character span ``[start, end)`` inside one message of a conversation, plus the
normalized key under which the image store files its pictures. Extractors find concepts in
text; :func:`validate_concepts` is the single place that checks spans against the text they
claim to cover, so every consumer (collator, store build, bench builder) fails the same way.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

__all__ = [
    "Concept",
    "ConceptExtractor",
    "LexiconExtractor",
    "normalize_concept",
    "validate_concepts",
]

_ARTICLES = ("a ", "an ", "the ")
_WS = re.compile(r"\s+")


def normalize_concept(text: str) -> str:
    """Return the store key for a concept's surface text.

    NFKC, case-folded, whitespace collapsed, surrounding punctuation and a leading article
    removed: ``"  The Red  Apple."`` -> ``"red apple"``.

    >>> normalize_concept("  The Red  Apple.")
    'red apple'
    """
    key = unicodedata.normalize("NFKC", text).casefold()
    key = _WS.sub(" ", key).strip(" \t\n\r.,;:!?\"'()[]{}")
    for article in _ARTICLES:
        if key.startswith(article) and len(key) > len(article):
            key = key[len(article) :]
            break
    return key


@dataclass(frozen=True)
class Concept:
    """A swappable span of one message.

    Args:
        message: index of the message in the conversation.
        start: first character of the span.
        end: one past the last character (``text[start:end]`` is the span).
        key: normalized store key; defaults to ``normalize_concept`` of the span text.
    """

    message: int
    start: int
    end: int
    key: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Concept:
        try:
            return cls(message=int(d["message"]), start=int(d["start"]), end=int(d["end"]), key=str(d["key"]))
        except KeyError as e:
            raise KeyError(
                f"concept entry is missing {e.args[0]!r}; expected keys message/start/end/key, got {sorted(d)}"
            ) from None


def validate_concepts(
    concepts: Sequence[Concept], messages: Sequence[str], sample_id: object = "?"
) -> list[Concept]:
    """Check spans against the message texts and return them sorted by position.

    Raises:
        ValueError: a span that is empty, out of range, points at a missing message, or
            overlaps another span; the message names the sample id and the span.
    """
    ordered = sorted(concepts, key=lambda c: (c.message, c.start, c.end))
    prev: Concept | None = None
    for c in ordered:
        if not 0 <= c.message < len(messages):
            raise ValueError(
                f"sample {sample_id!r}: concept {c.key!r} points at message {c.message}, "
                f"but the conversation has {len(messages)} messages"
            )
        n = len(messages[c.message])
        if not (0 <= c.start < c.end <= n):
            raise ValueError(
                f"sample {sample_id!r}: concept {c.key!r} span [{c.start}, {c.end}) is out of range for "
                f"message {c.message} of length {n}; spans must satisfy 0 <= start < end <= len(text)"
            )
        if prev is not None and prev.message == c.message and c.start < prev.end:
            raise ValueError(
                f"sample {sample_id!r}: concept spans overlap in message {c.message}: "
                f"{prev.key!r} [{prev.start}, {prev.end}) and {c.key!r} [{c.start}, {c.end}); "
                "drop one of them or merge them into a single concept"
            )
        prev = c
    return ordered


class ConceptExtractor(Protocol):
    """Anything that finds concept spans in a text: ``extract(text) -> [(start, end, key)]``."""

    def extract(self, text: str) -> list[tuple[int, int, str]]: ...


_STOPWORDS = frozenset(
    "a an the and or but if of to in on at by for with from as is are was were be been being this that these "
    "those it its i you he she we they me my your our their what which who whom how why when where can could "
    "would should will shall may might must do does did not no yes so than then there here about into over "
    "under up down out one two three".split()
)


class LexiconExtractor:
    """Offline concept extraction by longest match against a vocabulary of visual concepts.

    Matches respect word boundaries and case, prefer the longest entry at each position, skip
    stop words and numbers, and map each surface form to its store key (so ``"apples"`` can be
    filed under ``"apple"``).

    Args:
        vocabulary: concept keys, or ``{surface form: key}``.
        min_chars: surface forms shorter than this are ignored.

    >>> ex = LexiconExtractor(["apple", "red apple", "cat"])
    >>> ex.extract("A red apple and a Cat.")
    [(2, 11, 'red apple'), (18, 21, 'cat')]
    """

    def __init__(self, vocabulary: Iterable[str] | dict[str, str], min_chars: int = 3):
        items = vocabulary.items() if isinstance(vocabulary, dict) else ((v, v) for v in vocabulary)
        self._forms: dict[str, str] = {}
        for surface, key in items:
            form = normalize_concept(surface)
            if len(form) < min_chars or form in _STOPWORDS or form.replace(" ", "").isdigit():
                continue
            self._forms[form] = normalize_concept(key)
        if not self._forms:
            raise ValueError("LexiconExtractor: the vocabulary is empty after filtering stop words and numbers")
        # One alternation, longest forms first, so the regex engine does the longest match. Any
        # whitespace run matches a form's single space ("ice\ncream" wrapped across lines), as
        # extract() collapses it before the lookup.
        alternation = "|".join(
            r"\s+".join(map(re.escape, f.split(" "))) for f in sorted(self._forms, key=len, reverse=True)
        )
        self._pattern = re.compile(rf"(?<!\w)({alternation})(?!\w)", re.IGNORECASE)

    def __len__(self) -> int:
        return len(self._forms)

    def extract(self, text: str) -> list[tuple[int, int, str]]:
        out = []
        for m in self._pattern.finditer(text):
            form = _WS.sub(" ", m.group(1).casefold())
            key = self._forms.get(form)
            if key is not None:
                out.append((m.start(1), m.end(1), key))
        return out
