"""OCR control: the model transcribes each rendered image; character error rate against the source text.

CER = (S + D + I) / N_ref, where S + D + I is the character-level Levenshtein distance between
the normalised reference and hypothesis and N_ref the normalised reference length. Both sides are
normalised the same way first (Unicode NFC, every whitespace run -> one space, stripped), because
line breaks in a rendering come from word wrapping, not from the content. An item is
"OCR-correct" iff CER = 0.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["OCR_PROMPT", "cer", "edit_distance", "normalize_ocr_text", "ocr_correct"]

OCR_PROMPT = (
    "Transcribe all of the text in this image exactly as written, keeping every character, number and "
    "symbol. Output only the transcription, with no comments."
)

_WHITESPACE = re.compile(r"\s+")


def normalize_ocr_text(text: str) -> str:
    """NFC, collapse whitespace runs to one space, strip."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def edit_distance(reference: str, hypothesis: str) -> int:
    """Minimum number of character substitutions + deletions + insertions turning reference into hypothesis."""
    if len(reference) < len(hypothesis):
        reference, hypothesis = hypothesis, reference  # the distance is symmetric; keep the row short
    previous = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, start=1):
        current = [i]
        for j, h in enumerate(hypothesis, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1]


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate after normalisation; may exceed 1 when the hypothesis adds text.

    An empty (normalised) reference has nothing to read: CER is 0.0 for an empty hypothesis and
    1.0 for any other (it cannot be divided by N_ref = 0).

    >>> cer("abc", "abxc")
    0.3333333333333333
    """
    ref, hyp = normalize_ocr_text(reference), normalize_ocr_text(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)


def ocr_correct(reference: str, hypothesis: str) -> bool:
    """True iff the transcription is exact after normalisation (CER = 0)."""
    return normalize_ocr_text(reference) == normalize_ocr_text(hypothesis)
