"""TemplateEncoder: the learned-token mask from ids and byte lengths equals the offsets rule, always.

The reference is the tokenizer's own ``__call__`` with ``return_offsets_mapping=True``: a token is
learned when its character offsets overlap a learned range.
"""

from __future__ import annotations

import copy
import random
import unicodedata
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenswap.encoding import TemplateEncoder, token_byte_lengths

PIECES = (
    "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "assistant\n", "user\n",
    "\n", "\n\n", " ", "  ", "Hello", " world", "café", "cafe\u0301", "naïve", "你好", "🙂", "👩‍👩‍👧", "ü", "\t",
    "Réponse: oui — 好的.", "x" * 40, "1234", "  A circle.\n",
)  # fmt: skip


def reference(tokenizer, texts, ranges):
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for r, ids in enumerate(enc["input_ids"]):
        offsets = np.asarray(enc["offset_mapping"][r], dtype=np.int64).reshape(-1, 2)
        learnable = np.zeros(len(ids), dtype=bool)
        for lo, hi in ranges[r]:
            learnable |= (offsets[:, 1] > lo) & (offsets[:, 0] < hi)
        out.append((np.asarray(ids, dtype=np.int64), learnable))
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for (ids, mask), (ref_ids, ref_mask) in zip(got, want):
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_array_equal(mask, ref_mask)


def random_texts(rng: random.Random, n: int):
    texts, ranges = [], []
    for _ in range(n):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, 2 * rng.randint(0, 3))))
        texts.append(text)
        ranges.append([(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)])
    return texts, ranges


@pytest.fixture(params=["trained", "qwen"])
def tokenizer(request, family_processor):
    return family_processor("qwen2_vl", request.param).tokenizer


def test_byte_lengths_apply_to_both_tokenizers(tokenizer):
    table = token_byte_lengths(tokenizer)
    assert table is not None
    assert table[tokenizer.convert_tokens_to_ids("<|im_start|>")] == len("<|im_start|>")


def test_equals_the_offsets_rule_on_random_texts(tokenizer):
    rng = random.Random(0)
    encoder = TemplateEncoder(tokenizer)
    for _ in range(40):
        texts, ranges = random_texts(rng, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the first-batch check must not find a difference
            assert_same(encoder(texts, ranges), reference(tokenizer, texts, ranges))
    assert encoder._bytes is not None  # ... so the byte path stayed on


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=0, max_size=60), cut=st.tuples(st.integers(0, 60), st.integers(0, 60)))
def test_equals_the_offsets_rule_on_any_unicode(family_processor, text, cut):
    tokenizer = family_processor("qwen2_vl", "qwen").tokenizer
    text = "<|im_start|>assistant\n" + text.replace("\x00", "") + "<|im_end|>"
    lo, hi = sorted(min(c, len(text)) for c in cut)
    encoder = TemplateEncoder(tokenizer)
    try:
        want = reference(tokenizer, [text], [[(lo, hi)]])
    except Exception:  # noqa: BLE001 - lone surrogates: the tokenizer refuses them, the encoder must too
        with pytest.raises(Exception):  # noqa: B017
            encoder([text], [[(lo, hi)]])
        return
    assert_same(encoder([text], [[(lo, hi)]]), want)
    assert_same(encoder([text], [[(lo, hi)]]), want)  # second call: no cross-check any more


def test_non_nfc_text_uses_offsets_and_matches(family_processor):
    tokenizer = family_processor("qwen2_vl", "qwen").tokenizer
    text = "<|im_start|>assistant\ncafe\u0301 na\u0308ive<|im_end|>"
    assert not unicodedata.is_normalized("NFC", text)
    ranges = [[(len("<|im_start|>assistant\n"), len(text))]]
    assert_same(TemplateEncoder(tokenizer)(texts=[text], learn_ranges=ranges), reference(tokenizer, [text], ranges))


def test_backend_left_padding_by_an_earlier_call_does_not_change_ids(family_processor):
    tokenizer = family_processor("qwen2_vl", "qwen").tokenizer
    texts, ranges = random_texts(random.Random(1), 3)
    want = reference(tokenizer, texts, ranges)
    tokenizer._tokenizer.enable_padding(pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token, length=512)
    tokenizer._tokenizer.enable_truncation(max_length=3)
    try:
        assert_same(TemplateEncoder(tokenizer)(texts, ranges), want)
    finally:
        tokenizer._tokenizer.no_padding()
        tokenizer._tokenizer.no_truncation()


def test_learn_all_marks_every_token(tokenizer):
    texts, _ = random_texts(random.Random(2), 3)
    for (ids, mask), (ref_ids, _) in zip(TemplateEncoder(tokenizer)(texts, None), reference(tokenizer, texts, [[]] * 3)):
        np.testing.assert_array_equal(ids, ref_ids)
        assert mask.all() and len(mask) == len(ids)


def test_a_wrong_byte_table_is_caught_by_the_first_batch_check(tokenizer):
    text = "<|im_start|>assistant\nyes , no<|im_end|>"
    ranges = [[(len("<|im_start|>assistant\nyes"), len(text))]]
    want = reference(tokenizer, [text], ranges)
    ids, mask = want[0]
    k = int(np.flatnonzero(mask)[0])  # the first learned token
    before, first = int(ids[k - 1]), int(ids[k])
    assert before != first and list(ids).count(before) == list(ids).count(first) == 1
    encoder = TemplateEncoder(tokenizer)
    encoder._state = copy.copy(encoder._state)  # this encoder's own table, not the tokenizer's shared one
    encoder._state.checked = False
    # One byte moved from the first learned token to the one before it: the row still sums to the text's
    # bytes, so only the cross-check against offsets can see that the token before now looks learned.
    encoder._state.table = encoder._state.table.copy()
    encoder._state.table[before] += 1
    encoder._state.table[first] -= 1
    with pytest.warns(UserWarning, match="disagree"):
        got = encoder([text], ranges)
    assert_same(got, want)
    assert encoder._bytes is None  # offsets from then on


def test_whitespace_stripping_added_token_turns_the_byte_path_off(tmp_path, family_processor):
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    family_processor("qwen2_vl").tokenizer.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert token_byte_lengths(tokenizer) is not None
    tokenizer.add_tokens([AddedToken("<note>", rstrip=True)])
    assert token_byte_lengths(tokenizer) is None  # recomputed: the vocabulary grew
    text = "<|im_start|>assistant\n<note>   spaced<|im_end|>"
    ranges = [[(len("<|im_start|>assistant\n<note> "), len(text))]]
    assert_same(TemplateEncoder(tokenizer)([text], ranges), reference(tokenizer, [text], ranges))
