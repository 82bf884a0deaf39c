"""TokenSwapCollator: equivalence with the official processor, pairing, truncation, ZeRO-3 dummy, bad input."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import ImageStore, StoreWriter
from tokenswap.swap import SwapPolicy
from tokenswap.testing import assert_matches_processor

ASSETS = __import__("pathlib").Path(__file__).parents[1] / "assets"


def sample(sid, user, assistant="Sure.", concepts=(), extra_turns=()):
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}, *extra_turns]
    return {"id": sid, "messages": messages, "concepts": [dict(c) for c in concepts]}


def span(text, word, message=0, key=None, nth=0):
    start = -1
    for _ in range(nth + 1):
        start = text.index(word, start + 1)
    return {"message": message, "start": start, "end": start + len(word), "key": key or word}


@pytest.fixture
def collator(tiny_processor, tiny_store):
    return TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=1.0), dummy_image=False)


# ---------------------------------------------------------------------------- equivalence
def test_equivalent_to_processor_on_varied_conversations(collator, swap_samples):
    u1 = "cat at the start, then a banana"
    u2 = "ends with an apple"
    u3 = "adjacent: apple" + "banana" + " and café naïve ünïcödé 你好 🙂"
    examples = [
        sample("a", u1, concepts=[span(u1, "cat"), span(u1, "banana")]),
        sample("b", u2, concepts=[span(u2, "apple")]),
        sample("c", u3, "Réponse: oui — 好的.", concepts=[span(u3, "apple"), span(u3, "banana"), span(u3, "café")]),
        sample(
            "d",
            "first turn about a triangle",
            "A triangle has three sides.",
            concepts=[span("first turn about a triangle", "triangle")],
            extra_turns=[
                {"role": "user", "content": "and a circle?"},
                {"role": "assistant", "content": "  A circle has none.\n"},
            ],
        ),
        *swap_samples[:4],
    ]
    examples[3]["concepts"].append(span("and a circle?", "circle", message=2))
    batch = assert_matches_processor(collator, examples)
    assert batch["image_grid_thw"].shape[0] == collator.stats["images"] > 8


def test_equivalent_with_system_message_and_native_images(tiny_processor, tiny_store):
    collator = TokenSwapCollator(tiny_processor, tiny_store, image_root=str(ASSETS / "images"), dummy_image=False)
    text = "<image>\nIs this a square or a circle?"
    ex = {
        "id": "n0",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": text},
            {"role": "assistant", "content": "A square."},
        ],
        "concepts": [span(text, "circle", message=1)],
        "images": ["red_square.png"],
    }
    batch = assert_matches_processor(collator, [ex])
    assert batch["image_grid_thw"].shape[0] == 2  # the native image and the swapped circle


def test_text_arm_is_plain_text(tiny_processor, tiny_store, swap_samples):
    collator = TokenSwapCollator(tiny_processor, tiny_store, arm="text", dummy_image=False)
    batch = assert_matches_processor(collator, swap_samples, arm="text")
    assert "pixel_values" not in batch
    assert collator.stats["concepts_swapped"] == 0


# ---------------------------------------------------------------------------- labels and pairing
def assistant_targets(batch):
    return [row[row != -100].tolist() for row in batch["labels"]]


def test_labels_cover_assistant_tokens_and_im_end_only(collator, tiny_processor):
    u = "Is a cat an animal?"
    batch = collator([sample("x", u, "Yes, a mammal.", concepts=[span(u, "cat")])])
    tok = tiny_processor.tokenizer
    learned = tok.decode(assistant_targets(batch)[0])
    assert learned == "Yes, a mammal.<|im_end|>"


def test_paired_arms_share_order_and_byte_identical_targets(tiny_processor, tiny_store, swap_samples):
    paired = TokenSwapCollator(tiny_processor, tiny_store, arm="paired")
    for start in range(0, len(swap_samples), 4):
        out = paired(swap_samples[start : start + 4])
        text, swap = out["text"], out["tokenswap"]
        assert assistant_targets(text) == assistant_targets(swap)
        assert text["input_ids"].shape[0] == swap["input_ids"].shape[0]
        # the user side differs wherever a concept was swapped
        assert swap["mm_token_type_ids"].sum() > 0
    assert paired.stats["concepts_swapped"] > 0


def test_learn_all_masks_only_image_tokens(tiny_processor, tiny_store, swap_samples):
    collator = TokenSwapCollator(tiny_processor, tiny_store, learn="all", dummy_image=False)
    batch = collator(swap_samples[:3])
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
    vision = torch.isin(ids, torch.tensor([collator._image_pad, collator._vision_start, collator._vision_end]))
    assert torch.equal(labels[mask & ~vision], ids[mask & ~vision])
    assert (labels[vision | ~mask] == -100).all()


# ---------------------------------------------------------------------------- determinism
def test_decisions_do_not_depend_on_workers_or_resume(tiny_processor, tiny_store, swap_samples):
    from torch.utils.data import DataLoader

    policy = SwapPolicy(swap_prob=0.5, seed=3)

    def run(workers, skip=0):
        collator = TokenSwapCollator(tiny_processor, tiny_store, policy)
        loader = DataLoader(swap_samples[skip:], batch_size=2, collate_fn=collator, num_workers=workers)
        return [b["input_ids"] for b in loader]

    one, two = run(0), run(2)
    assert len(one) == len(two)
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    resumed = run(0, skip=4)  # a restart that skips the first two batches
    for a, b in zip(one[2:], resumed):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_swap_prob_half_swaps_some_and_keeps_some(tiny_processor, tiny_store, swap_samples):
    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=0.5, seed=1))
    collator(swap_samples)
    assert collator.stats["concepts_swapped"] > 0
    assert collator.stats["concepts_text_by_policy"] > 0


# ---------------------------------------------------------------------------- truncation
def test_truncation_never_splits_an_image_and_runs_through_the_model(tiny_processor, tiny_store, tiny_qwen2vl):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl)
    u = "apple " * 3 + "and a long tail " * 20
    ex = sample("long", u, "short answer", concepts=[span(u, "apple", nth=i) for i in range(3)])
    full = TokenSwapCollator(tiny_processor, tiny_store, max_length=None, dummy_image=False)([ex])
    n = full["input_ids"].shape[1]
    starts = (full["input_ids"][0] == full["input_ids"][0].new_tensor(tiny_processor.tokenizer.convert_tokens_to_ids("<|vision_start|>"))).nonzero().flatten().tolist()
    for cut in [starts[1] + 3, starts[2], n - 5]:  # inside the 2nd image, at the 3rd, in the tail
        collator = TokenSwapCollator(tiny_processor, tiny_store, max_length=cut, dummy_image=False)
        batch = collator([ex])
        ids = batch["input_ids"][0]
        assert len(ids) <= cut
        n_blocks = int((ids == collator._vision_start).sum())
        assert n_blocks == int((ids == collator._vision_end).sum()) == batch["image_grid_thw"].shape[0]
        expected_pads = int((batch["image_grid_thw"].prod(-1) // 4).sum())
        assert int((ids == collator._image_pad).sum()) == expected_pads
        assert collator.stats["samples_truncated"] == 1
        assert collator.stats["images_dropped_truncation"] == 3 - n_blocks
        with torch.no_grad():
            out = model(**batch)
        assert torch.isfinite(out.loss) or collator.stats["samples_truncated_no_targets"] == 1


# ---------------------------------------------------------------------------- ZeRO-3 dummy image
def test_dummy_image_when_batch_has_no_image(tiny_processor, tiny_store, tiny_qwen2vl):
    from transformers import AutoModelForImageTextToText

    collator = TokenSwapCollator(tiny_processor, tiny_store, arm="text")
    plain = [sample("t0", "no concepts here"), sample("t1", "none here either", "ok")]
    batch = collator(plain)
    assert batch["image_grid_thw"].shape == (1, 3)
    dummy_cols = batch["mm_token_type_ids"].bool()
    assert dummy_cols.any() and (batch["attention_mask"][dummy_cols] == 0).all()
    assert (batch["labels"][:, -dummy_cols.sum() - 2 :] == -100).all()
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl)
    no_dummy = TokenSwapCollator(tiny_processor, tiny_store, arm="text", dummy_image=False)(plain)
    loss_with = model(**batch).loss
    loss_without = model(**no_dummy).loss
    torch.testing.assert_close(loss_with, loss_without)  # masked: the dummy changes nothing
    loss_with.backward()
    assert any(p.grad is not None for p in model.model.visual.parameters())  # ... but the tower ran


def test_no_dummy_when_batch_has_images(collator, swap_samples):
    with_dummy = TokenSwapCollator(collator.processor, collator.store)
    batch = with_dummy(swap_samples[:2])
    assert with_dummy.stats["dummy_images"] == 0
    assert (batch["attention_mask"][batch["mm_token_type_ids"].bool()] == 1).all()


# ---------------------------------------------------------------------------- cache
def test_repeated_concepts_hit_the_pixel_cache(collator, swap_samples):
    collator(swap_samples)
    misses = collator.cache_info()["misses"]
    collator(swap_samples)
    info = collator.cache_info()
    assert info["misses"] == misses  # second pass: every image from the cache
    assert info["hits"] >= collator.stats["concepts_swapped"] // 2


def test_cache_is_bounded(tiny_processor, tiny_store, swap_samples):
    collator = TokenSwapCollator(tiny_processor, tiny_store, cache_bytes=300_000)
    collator(swap_samples)
    assert 0 < collator.cache_info()["bytes"] <= 300_000


# ---------------------------------------------------------------------------- bad input
def test_missing_image_stays_text_and_is_counted(collator, swap_samples):
    dog = next(s for s in swap_samples if any(c["key"] == "dog" for c in s["concepts"]))
    with pytest.warns(UserWarning, match="dog"):
        batch = collator([dog])
    assert collator.stats["concepts_text_missing_image"] == 1
    text = collator.processor.tokenizer.decode(batch["input_ids"][0])
    assert "dog" in text


def write_corrupt_entry(root, key):
    """Simulate on-disk damage: a shard row whose bytes no longer decode (StoreWriter refuses to write one)."""
    import pyarrow as pa

    from tokenswap.store.image_store import SCHEMA, image_id_of

    data = b"\x89PNG\r\n\x1a\ntruncated"  # under its own content hash: it reaches the decoder, which refuses it
    row = {"key": key, "concept": key, "image_id": image_id_of(data), "image": data,
           "source": "broken", "score": 1.0, "width": 8, "height": 8, "meta": "{}"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(pa.Table.from_pylist([row], schema=SCHEMA))
    (root / "shards" / "part-r009-000000.arrow").write_bytes(sink.getvalue().to_pybytes())


def test_corrupt_image_stays_text(tiny_processor, tmp_path):
    with StoreWriter(tmp_path) as w:
        w.add("apple", Image.new("RGB", (30, 30), "red"), source="ok")
    write_corrupt_entry(tmp_path, "cat")
    collator = TokenSwapCollator(tiny_processor, ImageStore(tmp_path), dummy_image=False)
    u = "a cat eats an apple"
    with pytest.warns(UserWarning, match="does not decode"):
        batch = collator([sample("c", u, concepts=[span(u, "cat"), span(u, "apple")])])
    assert collator.stats["concepts_text_corrupt_image"] == 1
    assert batch["image_grid_thw"].shape[0] == 1
    assert "cat" in tiny_processor.tokenizer.decode(batch["input_ids"][0])


@pytest.mark.parametrize(
    "concepts, match",
    [
        ([{"message": 0, "start": 2, "end": 5, "key": "cat"}, {"message": 0, "start": 4, "end": 8, "key": "apple"}], "overlap"),
        ([{"message": 0, "start": 15, "end": 90, "key": "cat"}], "out of range"),
        ([{"message": 5, "start": 0, "end": 1, "key": "cat"}], "message 5"),
        ([{"message": 0, "start": 3, "end": 3, "key": "cat"}], "out of range"),
    ],
)
def test_bad_spans_raise_with_sample_id(collator, concepts, match):
    with pytest.raises(ValueError, match=match) as e:
        collator([sample("bad-7", "a cat and apple", concepts=concepts)])
    assert "bad-7" in str(e.value)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"concepts": [{"message": 0, "start": 2, "key": "cat"}]}, r"concepts\[0\]: concept entry is missing 'end'"),
        ({"concepts": [{"message": 0, "start": "abc", "end": 5, "key": "cat"}]}, r"concepts\[0\]: concept `start` must be an integer"),
        ({"concepts": [{"message": 0, "start": 1.9, "end": 5, "key": "cat"}]}, r"concepts\[0\]: concept `start` must be an integer.*1\.9"),
        ({"concepts": {"message": 0, "start": 2, "end": 5, "key": "cat"}}, r"`concepts` must be a list"),
        ({"messages": [{"role": "user", "content": "a cat \udcff"}, {"role": "assistant", "content": "ok"}]},
         r"message 0 content: .*lone UTF-16 surrogate"),
        ({"messages": [{"role": "robot", "content": "a cat"}, {"role": "assistant", "content": "ok"}]},
         r"message 0 has role 'robot'; expected one of \['system', 'user', 'assistant'\]"),
        ({"messages": [{"role": None, "content": "a cat"}, {"role": "assistant", "content": "ok"}]},
         r"message 0 has role None"),
    ],
    ids=["no-end", "start-abc", "start-float", "concepts-dict", "surrogate", "role-robot", "role-none"],
)
def test_malformed_samples_raise_naming_the_sample(collator, change, match):
    with pytest.raises(ValueError, match=r"sample 'bad-8': " + match):
        collator([sample("ok", "a cat"), {**sample("bad-8", "a cat"), **change}])


def test_an_example_that_is_not_a_dict_is_named(collator):
    with pytest.raises(TypeError, match=r"example \['bad', 9\]: expected a sample dict .* got a list"):
        collator([sample("ok", "a cat"), ["bad", 9]])


def test_unknown_and_missing_keys_list_keys_seen(collator):
    with pytest.raises(KeyError, match=r"unknown \['uuid'\].*keys seen"):
        collator([{**sample("k", "hi"), "uuid": "x"}])
    with pytest.raises(KeyError, match=r"missing \['messages'\]"):
        collator([{"id": "k", "conversations": []}])


def test_native_image_marker_count_must_match(collator):
    ex = {**sample("m", "<image> and <image>"), "images": ["only_one.png"]}
    collator.on_bad_sample = "error"  # the default skips and counts it: test_collator_robustness.py
    with pytest.raises(ValueError, match="2 <image> markers but 1"):
        collator([ex])


def test_missing_native_image_skips_sample_not_batch(tiny_processor, tiny_store):
    collator = TokenSwapCollator(tiny_processor, tiny_store, image_root=str(ASSETS / "images"))
    good = {**sample("g", "<image>\nwhat?"), "images": ["red_square.png"]}
    bad = {**sample("b", "<image>\nwhat?"), "images": ["missing.png"]}
    with pytest.warns(UserWarning, match="missing.png"):
        batch = collator([good, bad])
    assert batch["input_ids"].shape[0] == 1
    assert collator.stats["samples_dropped_bad_native_image"] == 1


def test_processor_without_template_gets_the_qwen2vl_one(tiny_processor, tiny_store, swap_samples):
    bare = copy.deepcopy(tiny_processor)
    bare.chat_template = None
    with pytest.warns(UserWarning, match="no chat_template"):
        collator = TokenSwapCollator(bare, tiny_store, dummy_image=False)
    reference = TokenSwapCollator(tiny_processor, tiny_store, dummy_image=False)
    torch.testing.assert_close(collator(swap_samples[:2])["input_ids"], reference(swap_samples[:2])["input_ids"])


def test_rejects_a_non_qwen2vl_template(tiny_processor, tiny_store):
    other = copy.deepcopy(tiny_processor)
    other.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="does not match the qwen2_vl template"):
        TokenSwapCollator(other, tiny_store)


# ---------------------------------------------------------------------------- property-based
WORDS = ["cat", "apple", "banana", "the", "a", "café", "🙂", "naïve", "—", "\n", "  ", "tomato", "x1", "dog"]


@st.composite
def random_sample(draw):
    tokens = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=14))
    text, concepts, pos = "", [], 0
    for tok in tokens:
        sep = draw(st.sampled_from(["", " ", ", "]))
        text += sep
        start = len(text)
        text += tok
        if tok in ("cat", "apple", "banana", "tomato", "café", "dog") and draw(st.booleans()):
            concepts.append({"message": 0, "start": start, "end": start + len(tok), "key": tok})
        pos = len(text)
    assert pos == len(text)
    answer = draw(st.text(alphabet=st.sampled_from(list("abc xyz.\n🙂é")), min_size=1, max_size=20))
    return {"id": draw(st.text(min_size=1, max_size=6)), "messages": [
        {"role": "user", "content": text}, {"role": "assistant", "content": answer}], "concepts": concepts}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(examples=st.lists(random_sample(), min_size=1, max_size=3), prob=st.sampled_from([0.0, 0.5, 1.0]))
def test_property_matches_processor_for_random_spans(tiny_processor, tiny_store, examples, prob):
    collator = TokenSwapCollator(tiny_processor, tiny_store, SwapPolicy(swap_prob=prob), dummy_image=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = assert_matches_processor(collator, examples)
    targets = assistant_targets(batch)
    text_targets = assistant_targets(
        TokenSwapCollator(tiny_processor, tiny_store, arm="text", dummy_image=False)(examples)
    )
    assert targets == text_targets


# ---------------------------------------------------------------------------- trainers
@pytest.mark.integration
def test_two_steps_with_hf_trainer_and_trl_sft(tiny_qwen2vl, tiny_processor, tiny_store, swap_samples, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText, Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    from tokenswap.data.schema import to_sample_features

    ds = to_sample_features(Dataset.from_list(swap_samples))
    collator = TokenSwapCollator(tiny_processor, tiny_store)
    common = dict(
        per_device_train_batch_size=2, max_steps=2, learning_rate=1e-3, report_to=[], use_cpu=True,
        remove_unused_columns=False, save_strategy="no", logging_steps=1,
    )
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl)
    before = model.lm_head.weight.detach().clone()
    hf = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "hf"), **common), train_dataset=ds,
                 data_collator=collator)
    hf.train()
    assert not torch.equal(before, model.lm_head.weight)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in hf.state.log_history if "loss" in h)

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl)
    sft = SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=str(tmp_path / "sft"), max_length=None, dataset_kwargs={"skip_prepare_dataset": True},
                       **common),
        train_dataset=ds,
        data_collator=collator,
        processing_class=tiny_processor,
    )
    sft.train()
    assert sft.state.global_step == 2
    assert collator.stats["concepts_swapped"] > 0

