"""Concept spans: the unit TokenSwap replaces with an image.

A concept is a character span ``[start, end)`` inside one message of a conversation, plus the
normalized key under which the image store files its pictures. Extractors find concepts in
text; :func:`validate_concepts` is the single place that checks spans against the text they
claim to cover, so every consumer (collator, store build, bench builder) fails the same way;
:func:`sample_texts` and :func:`concepts_from_sample` check a raw sample where it enters (a loader
or the collator), naming the sample, so nothing malformed fails later without a name.
"""

from __future__ import annotations

import numbers
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

__all__ = [
    "ROLES",
    "Concept",
    "ConceptExtractor",
    "LexiconExtractor",
    "concepts_from_sample",
    "normalize_concept",
    "sample_texts",
    "text_problem",
    "validate_concepts",
]

ROLES = ("system", "user", "assistant")
"""Message roles of the sample schema (each family's template renders these three)."""

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
        """``{"message", "start", "end", "key"}`` -> Concept; offsets must be integers (``11.9`` is not cut to 11).

        Raises:
            KeyError: a key is missing.
            TypeError: ``d`` is not a mapping, an offset is not an integer or ``key`` is not a string.
        """
        if not isinstance(d, dict):
            raise TypeError(f"a concept must be an object with message/start/end/key, got {d!r:.80}")
        try:
            values = {name: d[name] for name in ("message", "start", "end", "key")}
        except KeyError as e:
            raise KeyError(
                f"concept entry is missing {e.args[0]!r}; expected keys message/start/end/key, got {sorted(d)}"
            ) from None
        for name in ("message", "start", "end"):
            v = values[name]
            # 5.0 is 5 (some JSON writers emit floats); 11.9 or "11" is a schema mismatch, never cut to an offset.
            integral = isinstance(v, numbers.Integral) or (isinstance(v, float) and v.is_integer())
            if isinstance(v, bool) or not integral:
                raise TypeError(f"concept `{name}` must be an integer (a character offset), got {v!r}")
        if not isinstance(values["key"], str):
            raise TypeError(f"concept `key` must be a string, got {values['key']!r}")
        return cls(message=int(values["message"]), start=int(values["start"]), end=int(values["end"]),
                   key=values["key"])


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


def text_problem(text: str) -> str | None:
    """Why ``text`` is not text every later stage can write and tokenize, or None.

    A JSON ``"\\udcff"`` escape decodes to a lone surrogate: a Python ``str`` that no UTF-8 writer, tokenizer or
    Arrow column accepts, so it must be refused where the row enters, not where it is first written.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"character {e.start} is {text[e.start]!r}, a lone UTF-16 surrogate (a JSON '\\ud8xx' escape "
                "without its pair?), which is not text")
    return None


def sample_texts(messages: object, sample_id: object = "?") -> list[str]:
    """The contents of a sample's ``messages``, checked.

    Raises:
        ValueError: naming the sample and the message: ``messages`` is not a list of ``{role, content}`` objects
            with a role in :data:`ROLES` and string content that is text (:func:`text_problem`).
    """
    if not isinstance(messages, list):
        raise ValueError(f"sample {sample_id!r}: `messages` must be a list of {{role, content}} objects, got "
                         f"{type(messages).__name__}")
    texts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"sample {sample_id!r}: message {i} needs a 'role' and a str 'content', got {m!r:.120}")
        if m.get("role") not in ROLES:
            raise ValueError(f"sample {sample_id!r}: message {i} has role {m.get('role')!r}; expected one of "
                             f"{list(ROLES)}")
        problem = text_problem(m["content"])
        if problem is not None:
            raise ValueError(f"sample {sample_id!r}: message {i} content: {problem}")
        texts.append(m["content"])
    return texts


def concepts_from_sample(raw: object, texts: Sequence[str], sample_id: object = "?") -> list[Concept]:
    """A sample's ``concepts`` entry as checked spans, sorted by position (:func:`validate_concepts`).

    Raises:
        ValueError: naming the sample and the concept: ``raw`` is not a list of ``{message, start, end, key}``
            objects with integer offsets and a string key, or a span is out of range or overlaps another.
    """
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"sample {sample_id!r}: `concepts` must be a list of {{message, start, end, key}} objects, "
                         f"got {type(raw).__name__}")
    concepts = []
    for k, c in enumerate(raw):
        try:
            concepts.append(Concept.from_dict(c))
        except (KeyError, TypeError) as e:
            raise ValueError(f"sample {sample_id!r}: concepts[{k}]: {e.args[0]}") from None
    return validate_concepts(concepts, texts, sample_id)


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
