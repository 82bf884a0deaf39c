"""Answer extraction for REST responses (CoT text in, one comparable answer out).

An unparsable response extracts to ``None``, which scores as wrong and never agrees with any
other answer (RER counts agreement on *answers*, and "no answer" is not one).

- multiple choice: the last standalone option letter after the last "answer" (case-insensitive);
  if there is none, the last standalone option letter anywhere. Letters are upper-case only so
  the article "a" never counts; the letter set is the item's (A-D for MMLU, up to E for ARC).
- numeric: the last number in the response (commas as thousands separators allowed), normalised
  so ``"18.00"``, ``"18"`` and ``"18.0"`` compare equal (all ``"18"``).
- SoEBench: the last ``X = value`` assignment of each variable; all variables must be present.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

__all__ = ["AnswerType", "extract_answer", "extract_mc", "extract_numeric", "extract_soe", "normalize_number"]

AnswerType = Literal["mc", "numeric", "soe"]

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?|-?\.\d+")
_ANSWER_WORD = re.compile(r"answer", re.IGNORECASE)


def normalize_number(text: str) -> str | None:
    """Canonical string of a number (``"1,234.50"`` -> ``"1234.5"``, ``"-0"`` -> ``"0"``); None if not a number."""
    try:
        value = Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_mc(response: str, letters: str = "ABCD") -> str | None:
    """The chosen option letter, or None.

    >>> extract_mc("B looks tempting, but the answer is C.")
    'C'
    >>> extract_mc("no option letter here") is None
    True
    """
    letter = re.compile(rf"(?<![A-Za-z0-9])([{re.escape(letters)}])(?![A-Za-z0-9])")
    anchors = list(_ANSWER_WORD.finditer(response))
    if anchors:
        hits = letter.findall(response[anchors[-1].end() :])
        if hits:
            return hits[-1]
    hits = letter.findall(response)
    return hits[-1] if hits else None


def extract_numeric(response: str) -> str | None:
    """The last number in the response, normalised; None if there is none.

    >>> extract_numeric("3 + 4 = 7, so she has 1,200.0 dollars.")
    '1200'
    """
    hits = _NUMBER.findall(response)
    return normalize_number(hits[-1]) if hits else None


def extract_soe(response: str, variables: str) -> str | None:
    """``"A=1,B=-2"`` from the last ``A = 1`` style assignment of each variable; None if any is missing.

    >>> extract_soe("so A = 2. Answer: A=3, B = -1", "AB")
    'A=3,B=-1'
    """
    values = []
    for var in variables:
        hits = re.findall(rf"(?<![A-Za-z0-9]){var}\s*=\s*(-?\d+(?:\.\d+)?)", response)
        if not hits:
            return None
        values.append(f"{var}={normalize_number(hits[-1])}")
    return ",".join(values)


def extract_answer(response: str, answer_type: AnswerType, options: str) -> str | None:
    """Dispatch on the item's answer type.

    Args:
        response: the model's full response.
        answer_type: ``"mc"``, ``"numeric"`` or ``"soe"``.
        options: option letters (mc) or variable names (soe); ignored for numeric.
    """
    if answer_type == "mc":
        return extract_mc(response, options)
    if answer_type == "numeric":
        return extract_numeric(response)
    if answer_type == "soe":
        return extract_soe(response, options)
    raise ValueError(f"answer_type must be 'mc', 'numeric' or 'soe', got {answer_type!r}")
