"""Concept extractors for the store build: the offline lexicon and an LLM asked for exact spans.

Both implement :class:`tokenswap.concepts.ConceptExtractor`: ``extract(text) -> [(start, end, key)]``
with character offsets into ``text``, sorted and non-overlapping.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from tokenswap.concepts import LexiconExtractor, normalize_concept
from tokenswap.inference.parsing import parse_json_response
from tokenswap.inference.types import ChatModel, LLMRequestError

__all__ = ["ExtractionStats", "LLMConceptExtractor", "build_lexicon", "plural_forms"]


def plural_forms(word: str) -> list[str]:
    """Regular English plurals of the last word of a concept (no dictionary; good enough for a lexicon).

    >>> plural_forms("red apple"), plural_forms("fox"), plural_forms("strawberry")
    (['red apples'], ['foxes'], ['strawberries'])
    """
    head, _, last = word.rpartition(" ")
    prefix = f"{head} " if head else ""
    if not last.isalpha() or last.endswith("s"):
        return []
    if last.endswith(("x", "z", "ch", "sh")):
        return [f"{prefix}{last}es"]
    if last.endswith("y") and len(last) > 1 and last[-2] not in "aeiou":
        return [f"{prefix}{last[:-1]}ies"]
    return [f"{prefix}{last}s"]


def build_lexicon(
    vocabulary: Iterable[str], aliases: dict[str, str] | None = None, plurals: bool = True, min_chars: int = 3
) -> LexiconExtractor:
    """A :class:`LexiconExtractor` over concept keys (e.g. ``ImageStore.keys()`` or a source vocabulary).

    Args:
        vocabulary: concept keys the extractor may return.
        aliases: extra ``{surface form: key}`` entries; keys need not be in ``vocabulary``.
        plurals: also match regular plurals of every key (``"apples"`` -> ``"apple"``).
        min_chars: surface forms shorter than this are ignored.
    """
    forms: dict[str, str] = {}
    keys = [normalize_concept(k) for k in vocabulary]
    if plurals:
        for key in keys:
            for form in plural_forms(key):
                forms.setdefault(form, key)
    # Keys win over generated plurals ("glasses" is its own emoji, not a plural of "glass").
    forms.update({k: k for k in keys})
    forms.update({normalize_concept(s): normalize_concept(k) for s, k in (aliases or {}).items()})
    return LexiconExtractor(forms, min_chars=min_chars)


# ----------------------------------------------------------------------------- LLM extractor

SYSTEM_PROMPT = (
    "You mark visualizable concepts in a text. A visualizable concept is a short noun phrase naming something "
    "one picture can show without words: a physical object, animal, plant, food, drink, vehicle, building, "
    "place, landscape, weather phenomenon, instrument or tool. Do not mark numbers, quantities, dates, units, "
    "mathematical expressions, formulas, code, names of variables or functions, abstract ideas, emotions, or "
    "anything whose exact wording the meaning of the text depends on."
)

USER_PROMPT = (
    "Find the visualizable concepts in the text between <<< and >>>. Character offsets count from 0 at the "
    "first character after <<<.\n\n<<<{text}>>>\n\n"
    'Answer with JSON only, in the form {{"concepts": [{{"text": "...", "start": 0, "end": 0}}]}}, where '
    '"text" is copied exactly from the text, "start" is the offset of its first character and "end" is one '
    'past its last character. Do not overlap spans. Answer {{"concepts": []}} if there are none.'
)

RETRY_PROMPT = (
    "That reply was not valid JSON in the requested form. Answer again with only a JSON object "
    '{"concepts": [{"text": "...", "start": 0, "end": 0}]} and nothing else.'
)

_NOT_VISUAL = re.compile(r"[0-9=+*/^<>%$€£{}\[\]\\|_]")


@dataclass
class ExtractionStats:
    """Counts kept by :class:`LLMConceptExtractor` across calls (for the build report)."""

    texts: int = 0
    spans_proposed: int = 0
    spans_kept: int = 0
    offsets_repaired: int = 0
    spans_dropped: int = 0
    retries: int = 0
    failed_texts: int = 0
    """Texts whose reply was not usable JSON twice in a row (no concepts for them, counted)."""
    failed_requests: int = 0
    """Texts whose request failed for good (server down, stalled, 5xx after retries): an error, not "no concepts"."""
    drop_reasons: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.spans_dropped += 1
        self.drop_reasons[reason] = self.drop_reasons.get(reason, 0) + 1

    def merge(self, other: ExtractionStats) -> None:
        for f in fields(self):
            if f.name == "drop_reasons":
                for k, v in other.drop_reasons.items():
                    self.drop_reasons[k] = self.drop_reasons.get(k, 0) + v
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class LLMConceptExtractor:
    """Ask a chat model for exact character spans of visualizable concepts, and check every one.

    Each proposed span is validated against the text at its offsets. When the offsets are
    wrong but the span text occurs in the text, the span is moved to that occurrence (the
    nearest one to the claimed start when there are several); otherwise it is dropped. Spans
    with digits or formula characters, empty or overlapping spans are dropped too. A reply
    that is not JSON is retried once with a corrective turn; a second failure yields no
    concepts for that text (counted in ``failed_texts``). A request that fails for good raises
    :class:`LLMRequestError` (counted in ``failed_requests``): the caller must not take it for "no
    concepts". Answers are cached by the chat model (``cache_path``), so a rerun of the build asks
    nothing twice. Thread-safe when the chat model is: many texts may be extracted at once.

    Args:
        chat_model: any :class:`tokenswap.inference.ChatModel`.
        max_concepts: keep at most this many spans per text (the first ones); None for all.
        max_span_chars: spans longer than this are not concepts and are dropped.
    """

    def __init__(self, chat_model: ChatModel, max_concepts: int | None = None, max_span_chars: int = 60):
        self.chat_model = chat_model
        self.max_concepts = max_concepts
        self.max_span_chars = max_span_chars
        self.stats = ExtractionStats()
        self._lock = threading.Lock()

    def _ask(self, text: str, stats: ExtractionStats) -> list | None:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT.format(text=text)},
        ]
        reply = self.chat_model.chat(messages)
        for attempt in range(2):
            try:
                concepts = parse_json_response(reply)["concepts"]
                if not isinstance(concepts, list):
                    raise TypeError("'concepts' is not a list")
                return concepts
            except (ValueError, KeyError, TypeError):
                if attempt == 1:
                    return None
                stats.retries += 1
                messages = messages + [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": RETRY_PROMPT},
                ]
                reply = self.chat_model.chat(messages)
        return None

    def _locate(self, text: str, span: str, start: object, stats: ExtractionStats) -> tuple[int, int] | None:
        """Return the offsets of ``span`` in ``text``, trusting ``start`` only if it points at it."""
        if isinstance(start, int) and not isinstance(start, bool) and text[start : start + len(span)] == span:
            return start, start + len(span)
        hits = [m.start() for m in re.finditer(re.escape(span), text)]
        if not hits:
            hits = [m.start() for m in re.finditer(re.escape(span), text, re.IGNORECASE)]
        if not hits:
            return None
        stats.offsets_repaired += 1
        anchor = start if isinstance(start, int) and not isinstance(start, bool) else 0
        best = min(hits, key=lambda h: (abs(h - anchor), h))
        return best, best + len(span)

    def extract(self, text: str, into: ExtractionStats | None = None) -> list[tuple[int, int, str]]:
        """The kept spans of ``text``; its counts go to :attr:`stats` and, when given, also to ``into`` (the build
        keeps them per committed chunk, so a resumed build reports the whole build's)."""
        # Counted per call and merged at the end, so concurrent calls never interleave their updates.
        stats = ExtractionStats(texts=1)
        try:
            kept = self._extract(text, stats)
        except LLMRequestError:
            with self._lock:
                self.stats.failed_requests += 1
            raise
        with self._lock:
            self.stats.merge(stats)
        if into is not None:
            into.merge(stats)
        return kept

    def _extract(self, text: str, stats: ExtractionStats) -> list[tuple[int, int, str]]:
        proposed = self._ask(text, stats)
        if proposed is None:
            stats.failed_texts += 1
            return []
        spans: list[tuple[int, int, str]] = []
        for item in proposed:
            stats.spans_proposed += 1
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                stats.drop("malformed")
                continue
            # Models pad spans with spaces or punctuation; the concept is the stripped core.
            raw = item["text"]
            core = raw.strip().strip(".,;:!?\"'()")
            if not core or len(core) > self.max_span_chars:
                stats.drop("empty_or_long")
                continue
            if _NOT_VISUAL.search(core):
                stats.drop("number_or_formula")
                continue
            start = item.get("start")
            if isinstance(start, int) and raw != core:
                start += raw.find(core)
            located = self._locate(text, core, start, stats)
            if located is None:
                stats.drop("not_in_text")
                continue
            key = normalize_concept(core)
            if not key:
                stats.drop("empty_or_long")
                continue
            spans.append((located[0], located[1], key))
        spans.sort()
        kept: list[tuple[int, int, str]] = []
        for span in spans:
            if kept and span[0] < kept[-1][1]:
                stats.drop("overlap")
                continue
            kept.append(span)
        if self.max_concepts is not None:
            kept = kept[: self.max_concepts]
        stats.spans_kept += len(kept)
        return kept
