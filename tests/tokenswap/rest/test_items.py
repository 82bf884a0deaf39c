"""Loaders on local files in the exact hub schemas; REST filters; modality splits and conversations."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tokenswap.errors import InputError
from tokenswap.rest.items import RestItem, build_conversation, filter_reason, load_source, read_items, write_items

MMLU_ROWS = [
    {"question": "What is 2 + 3?", "subject": "elementary_mathematics", "choices": ["4", "5", "6", "7"], "answer": 1},
    {"question": "x" * 900, "subject": "misc", "choices": ["a", "b", "c", "d"], "answer": 0},  # too long
    {"question": r"Evaluate $\frac{1}{2} + x^2$.", "subject": "algebra", "choices": ["1", "2", "3", "4"], "answer": 2},
    {"question": "A pen costs $5 and a book $10. Which is cheaper?", "subject": "misc",
     "choices": ["pen", "book", "same", "unknown"], "answer": 0},
]  # fmt: skip
ARC_ROWS = [
    {"id": "Mercury_7175875", "question": "Which gas do plants absorb?",
     "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["A", "B", "C"]}, "answerKey": "B"},
    {"id": "NYSEDREGENTS/2015:8", "question": "Which is a mammal?",
     "choices": {"text": ["shark", "whale", "trout", "eel"], "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
]  # fmt: skip
GSM_ROWS = [
    {"question": "Tom has 3 apples. He buys 4 more. How many apples does he have?", "answer": "3+4=7\n#### 7"},
    {"question": "What is 1,000 plus 234?", "answer": "#### 1,234"},  # one sentence: no mixed split
    {"question": "A box holds 12 eggs.  Ann buys 2 boxes.\nHow many eggs?", "answer": "2*12=24\n#### 24"},
]  # fmt: skip


def _write_parquet(rows, path):
    from datasets import Dataset

    Dataset.from_list(rows).to_parquet(str(path))
    return path


def _write_jsonl(rows, path):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mmlu_parquet_filters_and_mc_split(tmp_path):
    items, counts = load_source("mmlu", _write_parquet(MMLU_ROWS, tmp_path / "mmlu.parquet"))
    assert counts == {"kept": 2, "too_long": 1, "latex": 1}
    first = items[0]
    assert first.id == "mmlu-test-00000" and first.gold == "B" and first.options == "ABCD"
    assert first.stem == "What is 2 + 3?"
    assert first.query == "A. 4\nB. 5\nC. 6\nD. 7"
    assert first.text == f"{first.stem}\n{first.query}"
    assert first.meta["subject"] == "elementary_mathematics"
    assert items[1].id == "mmlu-test-00003"  # money "$" is not LaTeX


def test_mmlu_folder_with_splits_and_n(tmp_path):
    folder = tmp_path / "mmlu"
    folder.mkdir()
    _write_parquet(MMLU_ROWS, folder / "test-00000-of-00001.parquet")
    _write_parquet(MMLU_ROWS[:1], folder / "validation-00000-of-00001.parquet")
    items, _ = load_source("mmlu", folder, n=1)
    assert [i.id for i in items] == ["mmlu-test-00000"]
    items, _ = load_source("mmlu", folder, split="validation")
    assert [i.id for i in items] == ["mmlu-validation-00000"]


def test_arc_jsonl_relabels_numeric_keys(tmp_path):
    items, counts = load_source("arc", _write_jsonl(ARC_ROWS, tmp_path / "arc.jsonl"))
    assert counts == {"kept": 2}
    assert items[0].options == "ABC" and items[0].gold == "B"
    assert items[1].id == "arc-NYSEDREGENTS_2015_8"
    assert items[1].gold == "B" and items[1].query.startswith("A. shark\nB. whale")


def test_gsm_sentence_split_and_gold(tmp_path):
    items, counts = load_source("gsm", _write_jsonl(GSM_ROWS, tmp_path / "gsm.jsonl"))
    assert counts == {"kept": 2, "single_sentence": 1}
    tom, eggs = items
    assert tom.gold == "7" and tom.answer_type == "numeric"
    assert tom.stem == "Tom has 3 apples. He buys 4 more."
    assert tom.query == "How many apples does he have?"
    assert eggs.text == "A box holds 12 eggs. Ann buys 2 boxes. How many eggs?"  # whitespace collapsed
    assert eggs.gold == "24"


def test_schema_errors_name_the_field(tmp_path):
    with pytest.raises(InputError, match=r"bad\.jsonl' row 0: missing \['answer'\] for the cais/mmlu schema"):
        load_source("mmlu", _write_jsonl([{"question": "q", "choices": ["a", "b"]}], tmp_path / "bad.jsonl"))
    with pytest.raises(InputError, match="####"):
        load_source("gsm", _write_jsonl([{"question": "A. B?", "answer": "7"}], tmp_path / "bad2.jsonl"))


def test_filter_reason():
    assert filter_reason("plain text $5") is None
    assert filter_reason(r"\(x\)") == "latex"
    assert filter_reason("$x^2$") == "latex"
    assert filter_reason("a" * 801) == "too_long"


def test_items_roundtrip_and_conversations(tmp_path):
    item = RestItem(id="q", source="mmlu", answer_type="mc", gold="A", options="AB", text="Q?\nA. x\nB. y",
                    stem="Q?", query="A. x\nB. y")  # fmt: skip
    write_items([item], tmp_path / "items.jsonl")
    assert read_items(tmp_path / "items.jsonl") == [item]
    image = Image.new("RGB", (10, 10), "white")
    text = build_conversation(item, "text")[0]["content"]
    assert [p["type"] for p in text] == ["text"] and text[0]["text"].endswith(item.text)
    mixed = build_conversation(item, "mixed", image=image)[0]["content"]
    assert [p["type"] for p in mixed] == ["text", "image", "text"] and mixed[2]["text"].strip() == item.query
    whole = build_conversation(item, "image", image=image)[0]["content"]
    assert [p["type"] for p in whole] == ["text", "image"] and item.stem not in whole[0]["text"]
    with pytest.raises(ValueError, match="image="):
        build_conversation(item, "mixed")
