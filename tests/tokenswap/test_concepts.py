"""Concept keys, span validation and the offline lexicon extractor."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenswap.concepts import Concept, LexiconExtractor, normalize_concept, validate_concepts


# ---------------------------------------------------------------------------- normalize_concept
@pytest.mark.parametrize(
    "text, key",
    [
        ("  The Red  Apple.", "red apple"),
        ("an Owl", "owl"),
        ("A", "a"),  # a bare article is kept: it is the whole key
        ("the", "the"),
        ("Theatre", "theatre"),  # "the" only as a separate word
        ("apple\n\tpie", "apple pie"),
        ('"Cat!"', "cat"),
        ("(banana)", "banana"),
        ("STRASSE", "strasse"),
        ("Straße", "strasse"),  # casefold, not lower
        ("ｃａｆé", "café"),  # NFKC folds full-width letters
        ("cafe\u0301", "café"),  # NFKC composes the combining accent
        ("the the dog", "the dog"),  # only one leading article is removed
    ],
)
def test_normalize_concept(text, key):
    assert normalize_concept(text) == key


def test_normalize_is_idempotent_on_examples():
    for text in ["  The Red  Apple.", "An owl!", "ｃａｆé", "x"]:
        key = normalize_concept(text)
        assert normalize_concept(key) == key


# ---------------------------------------------------------------------------- validate_concepts
MESSAGES = ["a cat and a dog", "hello"]


def test_validate_sorts_by_message_and_position():
    spans = [Concept(1, 0, 5, "hello"), Concept(0, 12, 15, "dog"), Concept(0, 2, 5, "cat")]
    assert [c.key for c in validate_concepts(spans, MESSAGES)] == ["cat", "dog", "hello"]


def test_adjacent_spans_are_not_an_overlap():
    validate_concepts([Concept(0, 2, 5, "cat"), Concept(0, 5, 9, "and")], MESSAGES)


@pytest.mark.parametrize(
    "concepts, match",
    [
        ([Concept(0, 2, 5, "cat"), Concept(0, 4, 8, "t an")], r"sample 'ex-7'.*overlap in message 0.*'cat'.*'t an'"),
        ([Concept(0, 10, 99, "dog")], r"sample 'ex-7'.*out of range for message 0 of length 15"),
        ([Concept(0, 5, 5, "empty")], r"sample 'ex-7'.*\[5, 5\) is out of range"),
        ([Concept(0, -1, 3, "neg")], r"sample 'ex-7'.*out of range"),
        ([Concept(2, 0, 1, "x")], r"sample 'ex-7'.*points at message 2, but the conversation has 2 messages"),
        ([Concept(-1, 0, 1, "x")], r"sample 'ex-7'.*points at message -1"),
    ],
)
def test_validate_errors_name_the_sample(concepts, match):
    with pytest.raises(ValueError, match=match):
        validate_concepts(concepts, MESSAGES, "ex-7")


def test_concept_dict_round_trip_and_missing_key():
    c = Concept(0, 2, 5, "cat")
    assert Concept.from_dict(c.to_dict()) == c
    assert Concept.from_dict({"message": 0, "start": 2, "end": 5.0, "key": "cat"}) == c
    for bad in ({"start": 2.9}, {"start": "2"}, {"message": True}, {"key": 7}):  # never cut or cast silently
        with pytest.raises(TypeError, match="must be"):
            Concept.from_dict({**c.to_dict(), **bad})
    with pytest.raises(KeyError, match="missing 'end'.*message/start/end/key"):
        Concept.from_dict({"message": 0, "start": 2, "key": "cat"})


# ---------------------------------------------------------------------------- LexiconExtractor
def spans_text(text: str, spans: list[tuple[int, int, str]]) -> list[str]:
    return [text[s:e] for s, e, _ in spans]


def test_longest_match_wins():
    ex = LexiconExtractor(["apple", "red apple", "apple pie", "red apple pie"])
    text = "I ate a red apple pie and an apple."
    assert ex.extract(text) == [(8, 21, "red apple pie"), (29, 34, "apple")]


def test_word_boundaries_no_match_inside_words():
    ex = LexiconExtractor(["cat", "car"])
    assert ex.extract("concatenate scatter cart cats catalog") == []
    assert spans_text("a cat, the car.", ex.extract("a cat, the car.")) == ["cat", "car"]
    assert spans_text("(cat)/car-park", ex.extract("(cat)/car-park")) == ["cat", "car"]  # punctuation is a boundary


def test_case_insensitive_and_keys_are_normalized():
    ex = LexiconExtractor({"Red Apple": "The Red Apple", "CAT": "Cat"})
    assert ex.extract("RED APPLE and cAt") == [(0, 9, "red apple"), (14, 17, "cat")]


def test_surface_forms_map_to_their_store_key():
    ex = LexiconExtractor({"apples": "apple", "apple": "apple", "kitty": "cat"})
    assert [k for *_, k in ex.extract("Apples, an apple and a kitty")] == ["apple", "apple", "cat"]


def test_stop_words_numbers_and_short_forms_are_filtered():
    ex = LexiconExtractor(["the", "about", "2024", "12 34", "ox", "owl"])
    assert len(ex) == 1
    assert ex.extract("the owl about 2024 ox 12 34") == [(4, 7, "owl")]
    assert len(LexiconExtractor(["ox", "owl"], min_chars=2)) == 2
    with pytest.raises(ValueError, match="vocabulary is empty"):
        LexiconExtractor(["the", "and", "42"])


def test_multiword_matches_across_any_whitespace_run():
    ex = LexiconExtractor(["ice cream"])
    text = "ice cream, Ice\n  Cream and ice\tcream"
    assert ex.extract(text) == [(0, 9, "ice cream"), (11, 22, "ice cream"), (27, 36, "ice cream")]
    assert ex.extract("icecream ice-cream") == []


def test_unicode_forms():
    ex = LexiconExtractor(["café", "crème brûlée", "東京都"])
    text = "Un Café, une CRÈME BRÛLÉE à 東京都."
    assert [k for *_, k in ex.extract(text)] == ["café", "crème brûlée", "東京都"]
    assert spans_text(text, ex.extract(text)) == ["Café", "CRÈME BRÛLÉE", "東京都"]
    assert ex.extract("cafés") == []  # é is a word character: no match inside a word
    assert len(LexiconExtractor(["東京", "café"])) == 1  # min_chars counts characters, so 2-character CJK words need min_chars=2


VOCAB = ["apple", "red apple", "cat", "ice cream", "café", "owl", "guitar", "apple pie"]
WORDS = [*VOCAB, "the", "a", "and", "caterpillar", "pineapple", "CAT", "Red Apple", "Café", "42", "ice", "cream"]


@settings(max_examples=150, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORDS), max_size=12),
    seps=st.lists(st.sampled_from([" ", ", ", ". ", "\n", " (", ") ", "-", "/", "  \t"]), min_size=12, max_size=12),
)
def test_property_spans_are_disjoint_and_normalize_to_the_vocabulary(words, seps):
    text = "".join(w + s for w, s in zip(words, seps))
    ex = LexiconExtractor(VOCAB)
    spans = ex.extract(text)
    forms = {normalize_concept(v) for v in VOCAB}
    prev_end = 0
    for start, end, key in spans:
        assert prev_end <= start < end <= len(text)
        assert normalize_concept(text[start:end]) in forms
        assert key == normalize_concept(text[start:end])
        assert not (start > 0 and text[start - 1].isalnum()) and not (end < len(text) and text[end].isalnum())
        prev_end = end
    validate_concepts([Concept(0, s, e, k) for s, e, k in spans], [text])
