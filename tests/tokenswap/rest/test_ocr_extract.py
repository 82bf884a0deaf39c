"""CER edge cases and answer extraction."""

from __future__ import annotations

import pytest

from tokenswap.rest.extract import extract_answer, extract_mc, extract_numeric, extract_soe
from tokenswap.rest.ocr import cer, edit_distance, normalize_ocr_text, ocr_correct


def test_cer_exact_and_whitespace_insensitive():
    assert cer("2A + B = 7\nWhat is A?", "2A + B = 7 What is A?") == 0.0
    assert cer("  hello   world ", "hello world") == 0.0
    assert ocr_correct("a\tb", "a b")


def test_cer_empty_reference():
    assert cer("", "") == 0.0
    assert cer("   ", "") == 0.0
    assert cer("", "spurious") == 1.0


def test_cer_insertions_only_can_exceed_one():
    assert cer("ab", "aXbY") == pytest.approx(2 / 2)
    assert cer("a", "abcd") == pytest.approx(3.0)
    assert cer("abc", "") == 1.0  # deletions only


def test_cer_substitution_and_unicode_normalisation():
    decomposed = "cafe\u0301"  # e + combining acute
    assert cer("café", decomposed) == 0.0
    assert normalize_ocr_text(decomposed) == "café"
    assert cer("café", "cafe") == pytest.approx(1 / 4)


def test_edit_distance_is_levenshtein():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == edit_distance("abc", "") == 3


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is B.", "B"),
        ("A seems right but the Answer: (C)", "C"),
        ("Options A and D... answer: D", "D"),
        ("I think it's D", "D"),  # fallback: last standalone letter
        ("ANSWER: b", None),  # lower case is not an option letter
        ("no idea", None),
        ("Answer: E", None),  # E is not an option of a 4-option item ...
    ],
)
def test_extract_mc(response, expected):
    assert extract_mc(response) == expected


def test_extract_mc_five_options_and_dispatch():
    assert extract_answer("Answer: E", "mc", "ABCDE") == "E"
    assert extract_answer("so 3 + 4 = 7.0", "numeric", "") == "7"
    with pytest.raises(ValueError, match="answer_type"):
        extract_answer("x", "bool", "")


def test_extract_numeric():
    assert extract_numeric("She pays $1,234.50 in total") == "1234.5"
    assert extract_numeric("-3 degrees") == "-3"
    assert extract_numeric("no numbers") is None


def test_extract_soe():
    assert extract_soe("A = 1 then A=2, B = -3", "AB") == "A=2,B=-3"
    assert extract_soe("A = 1", "AB") is None
