"""Qwen2's tokenizer built from dashscope's ranks: equal to tiktoken on the same ranks, real special-token ids."""

from __future__ import annotations

import random

import pytest

from tokenswap.qwen_tokenizer import (
    QWEN_ADDED_TOKENS,
    QWEN_NUM_RANKS,
    build_qwen_tokenizer,
    nfc,
    qwen_tiktoken,
    qwen_tiktoken_path,
)


@pytest.fixture(scope="module")
def qwen_tok():
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def reference():
    return qwen_tiktoken()


def test_special_tokens_have_the_released_ids(qwen_tok):
    assert len(qwen_tok) == QWEN_NUM_RANKS + len(QWEN_ADDED_TOKENS) == 151669
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<think>": 151667}
    assert {t: qwen_tok.convert_tokens_to_ids(t) for t in expected} == expected
    assert (qwen_tok.eos_token, qwen_tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    ids = qwen_tok("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and ids[-1] == 151645  # special tokens are never split by BPE


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(32, 127)] + list("\n\t\r\u00a0\u3000éüßñ你好世界こんにちは한국어—½€🙂👍🏽\u0301\u200d")
    words = ["the", " cat", "concat", "(cat", "ing", "\n\n", "  ", "123456", "Hello", "naïve", "e\u0301", "<|im_end|>",
             "'s", "'LL", "\r\n", " \n ", "🙂🙂", "https://x.y/z?a=1", "3.14159", "    def f():"]
    out = []
    for i in range(n):
        if i % 2:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))))
        else:
            out.append("".join(rng.choice(words) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(1, 15))))
    return out


def test_equals_tiktoken_on_random_strings(qwen_tok, reference):
    texts = random_texts(2000)
    ours = qwen_tok(texts, add_special_tokens=False)["input_ids"]
    mismatches = [(t, a, b) for t, a in zip(texts, ours) if a != (b := reference.encode(nfc(t), allowed_special="all"))]
    assert not mismatches, mismatches[:3]
    assert all(qwen_tok.decode(ids) == nfc(t) for t, ids in zip(texts[:200], ours[:200]))


def test_nfc_normalisation(qwen_tok):
    assert qwen_tok("cafe\u0301")["input_ids"] == qwen_tok("caf\u00e9")["input_ids"]


def test_built_once_then_loaded_offline(tmp_path, monkeypatch):
    first = build_qwen_tokenizer(cache_dir=tmp_path)
    (folder,) = tmp_path.iterdir()
    assert (folder / "tokenizer.json").is_file() and not list(tmp_path.glob("*.tmp-*"))
    built_at = (folder / "tokenizer.json").stat().st_mtime_ns
    # Loading from the cache reads neither the ranks nor the network.
    monkeypatch.setattr("tokenswap.qwen_tokenizer._from_ranks", lambda ranks: pytest.fail("rebuilt from the ranks"))
    again = build_qwen_tokenizer(cache_dir=tmp_path)
    assert (folder / "tokenizer.json").stat().st_mtime_ns == built_at
    text = "Cached: concat(cat) 你好 🙂\n\n"
    assert again(text)["input_ids"] == first(text)["input_ids"]


def test_missing_dashscope_names_the_install_line(monkeypatch):
    import importlib.util

    assert qwen_tiktoken_path().name == "qwen.tiktoken"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install dashscope"):
        qwen_tiktoken_path()
