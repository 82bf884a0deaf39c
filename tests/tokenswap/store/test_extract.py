"""Concept extraction: the lexicon builder and the LLM extractor against a scripted local server."""

from __future__ import annotations

import json

import pytest

from tokenswap.inference import OpenAIChatModel
from tokenswap.store.extract import LLMConceptExtractor, build_lexicon

TEXT = "I bought a red apple and 3 bananas; the Cat ate the apple."


def _reply(*spans):
    return json.dumps({"concepts": [{"text": t, "start": s, "end": e} for t, s, e in spans]})


def test_lexicon_matches_plurals_and_aliases():
    lex = build_lexicon(["red apple", "apple", "banana", "cat", "glasses"], aliases={"kitty": "cat"})
    assert lex.extract("Two bananas, a kitty and my glasses.") == [(4, 11, "banana"), (15, 20, "cat"), (28, 35, "glasses")]


@pytest.mark.integration
def test_llm_extractor_keeps_good_spans_and_repairs_wrong_offsets(fake_openai, tmp_path):
    fake_openai.reply = lambda payload: (
        "Here are the concepts:\n```json\n"
        + _reply(("red apple", 11, 20), ("Cat", 0, 3), ("apple", 55, 60), ("3 bananas", 25, 34), ("unicorn", 0, 7))
        + "\n```"
    )
    chat = OpenAIChatModel(fake_openai.base_url, "m", cache_path=tmp_path / "cache.jsonl")
    ex = LLMConceptExtractor(chat)
    spans = ex.extract(TEXT)
    for start, end, key in spans:
        assert TEXT[start:end].lower().endswith(key.split()[-1])
    # "Cat" had offsets 0..3 (wrong): moved to its only occurrence. "apple" at 55 is nearest the
    # second occurrence. "3 bananas" is a number; "unicorn" is not in the text.
    assert spans == [(11, 20, "red apple"), (40, 43, "cat"), (52, 57, "apple")]
    assert ex.stats.offsets_repaired == 2
    assert ex.stats.drop_reasons == {"number_or_formula": 1, "not_in_text": 1}
    # The cache answers a rerun: no new request.
    n = len(fake_openai.requests)
    assert LLMConceptExtractor(OpenAIChatModel(fake_openai.base_url, "m", cache_path=tmp_path / "cache.jsonl")).extract(TEXT) == spans
    assert len(fake_openai.requests) == n


@pytest.mark.integration
def test_llm_extractor_retries_once_on_malformed_json(fake_openai):
    replies = iter(["I think the concepts are apple and cat.", _reply(("apple", 52, 57))])
    fake_openai.reply = lambda payload: next(replies)
    ex = LLMConceptExtractor(OpenAIChatModel(fake_openai.base_url, "m"))
    assert ex.extract(TEXT) == [(52, 57, "apple")]
    assert ex.stats.retries == 1
    retry = fake_openai.requests[1]["messages"]
    assert retry[-2]["role"] == "assistant" and "JSON" in retry[-1]["content"]


@pytest.mark.integration
def test_llm_extractor_gives_up_after_two_malformed_replies(fake_openai):
    fake_openai.reply = lambda payload: "no idea"
    ex = LLMConceptExtractor(OpenAIChatModel(fake_openai.base_url, "m"))
    assert ex.extract(TEXT) == []
    assert ex.stats.failed_texts == 1 and len(fake_openai.requests) == 2


@pytest.mark.integration
def test_llm_extractor_drops_overlaps_and_padding(fake_openai):
    fake_openai.reply = lambda payload: _reply((" red apple.", 10, 21), ("apple", 15, 20), ("x = y + 1", 0, 9))
    ex = LLMConceptExtractor(OpenAIChatModel(fake_openai.base_url, "m"))
    assert ex.extract(TEXT) == [(11, 20, "red apple")]
    assert ex.stats.drop_reasons == {"overlap": 1, "number_or_formula": 1}
