"""TokenSwapCollator on every model family, with a trained toy tokenizer and with Qwen2's real one.

Every batch is compared token for token and pixel for pixel with what the family's own processor
and released chat template produce for the same interleaved conversation.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenswap.collator import TokenSwapCollator
from tokenswap.families import FAMILIES, UnsupportedFamilyError, family_of
from tokenswap.swap import SwapPolicy
from tokenswap.testing import TINY_FAMILIES, TINY_MOE_FAMILIES, assert_matches_processor

# The families whose released checkpoints use Qwen2's vocabulary (Qwen3.5 has its own, unpackaged).
REAL_TOKENIZER_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def sample(sid, user, assistant="Sure.", concepts=(), extra_turns=(), system=None):
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}, *extra_turns]
    concepts = [dict(c) for c in concepts]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
        for c in concepts:
            c["message"] += 1
    return {"id": sid, "messages": messages, "concepts": concepts}


def span(text, word, message=0, key=None):
    start = text.index(word)
    return {"message": message, "start": start, "end": start + len(word), "key": key or word}


def targets(batch, tokenizer):
    return [tokenizer.decode(row[row != -100]) for row in batch["labels"]]


def varied_examples():
    u1 = "cat at the start, then a banana"
    u2 = " ends with an apple "
    u3 = "adjacent: apple" + "banana" + " and café naïve ünïcödé 你好 🙂"
    u4 = "first turn about a triangle"
    return [
        sample("a", u1, concepts=[span(u1, "cat"), span(u1, "banana")]),
        sample("b", u2, "\n leading newline and trailing space ", concepts=[span(u2, "apple")], system=" Be brief.\n"),
        sample("c", u3, "Réponse: oui — 好的.", concepts=[span(u3, "apple"), span(u3, "banana"), span(u3, "café")]),
        sample(
            "d", u4, "A triangle has three sides.", concepts=[span(u4, "triangle")],
            extra_turns=[{"role": "user", "content": "and a circle?"},
                         {"role": "assistant", "content": "  A circle has none.\n"}],
        ),
    ]


# ---------------------------------------------------------------------------- the table
def test_family_of_model_types_configs_and_processors(family_processor):
    assert family_of("qwen2_5_vl").model_class == "Qwen2_5_VLForConditionalGeneration"
    assert family_of("qwen3_vl_moe").chat_template == FAMILIES["qwen3_vl"].chat_template
    for name in TINY_FAMILIES:
        processor = family_processor(name)
        assert family_of(processor).name == name  # Qwen3-VL and Qwen3.5 share Qwen3VLProcessor
        assert processor.chat_template == FAMILIES[name].chat_template  # the released template, saved
    from transformers import AutoConfig

    assert family_of(AutoConfig.for_model("qwen3_5")).name == "qwen3_5"


# sha256 of the released templates as transcribed (the values of families.py's string constants before they moved to
# tokenswap/assets/chat_templates/): a template one byte off (an editor's final newline) renders other token ids.
RELEASED_TEMPLATE_SHA256 = {
    "qwen2_vl": "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb",
    "qwen3_vl": "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4",
    "qwen3_5": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
}


def test_the_released_templates_are_package_data_byte_for_byte():
    import hashlib
    from importlib import resources

    for name, digest in RELEASED_TEMPLATE_SHA256.items():
        asset = (resources.files("tokenswap") / "assets" / "chat_templates" / f"{name}.jinja").read_bytes()
        assert FAMILIES[name].chat_template.encode() == asset
        assert hashlib.sha256(asset).hexdigest() == digest, f"{name}.jinja is not the released template any more"


def test_unsupported_family_names_the_supported_ones(tiny_store):
    with pytest.raises(UnsupportedFamilyError, match="qwen2_vl, qwen2_5_vl, qwen3_vl.*qwen3_5"):
        family_of("llava")
    from transformers import AutoConfig

    with pytest.raises(UnsupportedFamilyError, match="model_type 'idefics3'"):
        family_of(AutoConfig.for_model("idefics3"))

    class OtherProcessor:
        tokenizer = image_processor = None
        chat_template = "{{ messages }}"

    with pytest.raises(ValueError, match="processor OtherProcessor is not a supported model family; tokenswap supports"):
        TokenSwapCollator(OtherProcessor(), tiny_store)


def test_testing_cli_writes_a_loadable_family_checkpoint_and_store(tmp_path, capsys):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tokenswap.testing import main

    assert main([str(tmp_path), "--family", "qwen2_5_vl"]) == 0
    processor = AutoProcessor.from_pretrained(tmp_path / "tiny-qwen2_5_vl")
    assert processor.chat_template == FAMILIES["qwen2_5_vl"].chat_template
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "tiny-qwen2_5_vl")
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert (tmp_path / "tiny-store" / "store.json").is_file()
    # The kit's store covers its own swap data: the README's tiny TokenSwap arm warns of no missing image.
    import json
    from pathlib import Path

    from tokenswap.store.image_store import ImageStore

    keys = {c["key"] for line in (Path(__file__).parents[1] / "assets" / "swap_tiny.jsonl").read_text().splitlines()
            for c in json.loads(line)["concepts"]}
    store = ImageStore(tmp_path / "tiny-store")
    assert [k for k in sorted(keys) if not store.get(k)] == []
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--family", "qwen3_5", "--tokenizer", "qwen"])
    assert "qwen3_5 uses another (Qwen3_5Tokenizer)" in capsys.readouterr().err


TEXT = st.lists(st.sampled_from([*"ab \n\té🙂", "<think>", "</think>", "<tool_response>", "</tool_response>"]),
                max_size=10).map("".join)


@st.composite
def conversation(draw):
    def parts():
        items = draw(st.lists(st.one_of(TEXT.map(lambda t: {"type": "text", "text": t}), st.just({"type": "image"})),
                              max_size=4))
        return items or [{"type": "text", "text": ""}]

    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": [{"type": "text", "text": draw(TEXT)}]})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": parts()})
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": [{"type": "text", "text": draw(TEXT)}]})
    return messages


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=150, deadline=None)
@given(messages=conversation())
def test_render_conversation_equals_the_released_template(family, messages):
    from transformers.utils.chat_template_utils import render_jinja_template

    from tokenswap.families import render_conversation

    fam = FAMILIES[family]
    try:
        (theirs,), _ = render_jinja_template(conversations=[messages], chat_template=fam.chat_template)
    except Exception:  # the released template refuses it (Qwen3.5: only tool responses as user turns): so do we
        with pytest.raises(ValueError):
            render_conversation(fam, messages, fam.default_system_prompt)
        return
    ours, learn = render_conversation(fam, messages, fam.default_system_prompt)
    assert ours == theirs
    turns = [m for m in messages if m["role"] == "assistant"]
    assert len(learn) == len(turns) and all(ours[hi - len("<|im_end|>"):hi] == "<|im_end|>" for _, hi in learn)
    assert all(ours[lo - len("<|im_start|>assistant\n"):lo] == "<|im_start|>assistant\n" for lo, _ in learn)


# ---------------------------------------------------------------------------- equivalence
@pytest.mark.compat
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_equivalent_to_the_family_processor(family, family_processor, tiny_store, swap_samples):
    processor = family_processor(family)
    collator = TokenSwapCollator(processor, tiny_store, SwapPolicy(swap_prob=1.0), dummy_image=False)
    batch = assert_matches_processor(collator, [*varied_examples(), *swap_samples[:3]])
    assert batch["image_grid_thw"].shape[0] == collator.stats["concepts_swapped"] > 8
    text_arm = TokenSwapCollator(processor, tiny_store, arm="text", dummy_image=False)
    assert "pixel_values" not in assert_matches_processor(text_arm, swap_samples[:3], arm="text")
    patch = processor.image_processor.patch_size
    assert patch == (16 if family in ("qwen3_vl", "qwen3_5") else 14)
    assert batch["pixel_values"].shape[1] == 3 * 2 * patch * patch


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_system_prompt_and_labels_follow_the_family_template(family, family_processor, tiny_store):
    tok = family_processor(family).tokenizer
    collator = TokenSwapCollator(family_processor(family), tiny_store, SwapPolicy(swap_prob=1.0), dummy_image=False)
    u = "Is a cat an animal?"
    batch = collator([sample("x", u, " Yes, a mammal. ", concepts=[span(u, "cat")])])
    text = tok.decode(batch["input_ids"][0])
    if family in ("qwen2_vl", "qwen2_5_vl"):
        assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
        assert targets(batch, tok) == [" Yes, a mammal. <|im_end|>"]
    elif family == "qwen3_vl":
        assert text.startswith("<|im_start|>user\nIs a ")  # no default system message
        assert targets(batch, tok) == [" Yes, a mammal. <|im_end|>"]
    else:  # Qwen3.5 trims contents and writes an empty think block before the final answer
        assert text.startswith("<|im_start|>user\nIs a ")
        assert targets(batch, tok) == ["<think>\n\n</think>\n\nYes, a mammal.<|im_end|>"]


def test_qwen3_5_earlier_turns_keep_no_think_block(family_processor, tiny_store):
    tok = family_processor("qwen3_5").tokenizer
    collator = TokenSwapCollator(family_processor("qwen3_5"), tiny_store, dummy_image=False)
    ex = sample("t", "q1", "<think>\nlong thought\n</think>\n\nA1", extra_turns=[
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "A2"}])
    assert_matches_processor(collator, [ex])
    # The template drops the reasoning of turns before the last user message.
    assert targets(collator([ex]), tok) == ["A1<|im_end|><think>\n\n</think>\n\nA2<|im_end|>"]


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_swap_roles_whose_images_the_template_drops_are_refused(family, family_processor, tiny_store):
    with pytest.raises(ValueError, match=f"includes \\['system'\\], but the {family} chat template renders images only"):
        TokenSwapCollator(family_processor(family), tiny_store, SwapPolicy(roles=("user", "system")))


def test_conversations_the_template_rejects_are_skipped_and_counted(family_processor, tiny_store, tmp_path):
    from PIL import Image

    Image.new("RGB", (40, 40), "red").save(tmp_path / "red.png")
    good = sample("ok", "hi", "hello")
    image_in_system = {**sample("sys-img", "what is it?", system="<image> is the topic."), "images": ["red.png"]}
    collator = TokenSwapCollator(family_processor("qwen3_vl"), tiny_store, image_root=str(tmp_path), dummy_image=False)
    with pytest.warns(UserWarning, match="sample 'sys-img' skipped: message 0 \\(system\\) has an image"):
        batch = collator([good, image_in_system])
    assert batch["input_ids"].shape[0] == 1 and collator.stats["samples_skipped_template"] == 1

    no_user = {"id": "no-user", "messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}
    strict = TokenSwapCollator(family_processor("qwen3_5"), tiny_store, on_bad_sample="error")
    with pytest.raises(ValueError, match="sample 'no-user': the Qwen3.5 chat template needs at least one user message"):
        strict([good, no_user])


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_processor_without_template_gets_its_family_template(family, family_processor, tiny_store, swap_samples):
    bare = copy.deepcopy(family_processor(family))
    bare.chat_template = None
    with pytest.warns(UserWarning, match=f"using the {family} Instruct template"):
        collator = TokenSwapCollator(bare, tiny_store, dummy_image=False)
    reference = TokenSwapCollator(family_processor(family), tiny_store, dummy_image=False)
    torch.testing.assert_close(collator(swap_samples[:2])["input_ids"], reference(swap_samples[:2])["input_ids"])


def test_another_family_template_is_rejected(family_processor, tiny_store):
    qwen3 = copy.deepcopy(family_processor("qwen3_vl"))
    qwen3.chat_template = FAMILIES["qwen2_vl"].chat_template  # inserts a system message Qwen3-VL does not
    with pytest.raises(ValueError, match="does not match the qwen3_vl template"):
        TokenSwapCollator(qwen3, tiny_store)
    # ... unless the collator is told to insert the same one.
    TokenSwapCollator(qwen3, tiny_store, system_prompt="You are a helpful assistant.")


@pytest.mark.parametrize("family", TINY_FAMILIES + TINY_MOE_FAMILIES)
def test_batches_run_through_the_family_model(family, tiny_family, family_processor, tiny_store, swap_samples):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_family(family))
    assert type(model).__name__ == FAMILIES[family].model_class
    collator = TokenSwapCollator(family_processor(family), tiny_store, SwapPolicy(swap_prob=1.0))
    batch = collator(swap_samples[:2])
    assert batch["image_grid_thw"].shape[0] > 0
    # A text batch gets the masked ZeRO-3 dummy image, sized from this family's patch size.
    text = TokenSwapCollator(family_processor(family), tiny_store, arm="text")(swap_samples[:2])
    no_dummy = TokenSwapCollator(family_processor(family), tiny_store, arm="text", dummy_image=False)(swap_samples[:2])
    assert text["image_grid_thw"].shape == (1, 3) and "pixel_values" not in no_dummy
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Qwen3.5's reference linear-attention kernels warn on CPU
        assert torch.isfinite(model(**batch).loss)
        torch.testing.assert_close(model(**text).loss, model(**no_dummy).loss)  # masked: changes nothing


# ---------------------------------------------------------------------------- property-based
WORDS = ["cat", "apple", "banana", "the", "a", "café", "🙂", "naïve", "—", "\n", "  ", "tomato", "x1", "dog", "(", "con"]


@st.composite
def random_sample(draw):
    tokens = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=14))
    text, concepts = "", []
    for tok in tokens:
        text += draw(st.sampled_from(["", " ", ", "]))
        start = len(text)
        text += tok
        if tok in ("cat", "apple", "banana", "tomato", "café", "dog") and draw(st.booleans()):
            concepts.append({"message": 0, "start": start, "end": start + len(tok), "key": tok})
    answer = draw(st.text(alphabet=st.sampled_from(list("abc xyz.\n🙂é")), min_size=1, max_size=20))
    return {"id": draw(st.text(min_size=1, max_size=6)), "messages": [
        {"role": "user", "content": text}, {"role": "assistant", "content": answer}], "concepts": concepts}


@pytest.mark.parametrize("family, tokenizer", [
    *[(f, "trained") for f in TINY_FAMILIES if f != "qwen2_vl"],  # qwen2_vl: tests/tokenswap/test_collator.py
    *[(f, "qwen") for f in REAL_TOKENIZER_FAMILIES],
])
def test_property_matches_processor_for_random_spans(family, tokenizer, family_processor, tiny_store):
    processor = family_processor(family, tokenizer)

    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(examples=st.lists(random_sample(), min_size=1, max_size=3), prob=st.sampled_from([0.0, 0.5, 1.0]))
    def check(examples, prob):
        collator = TokenSwapCollator(processor, tiny_store, SwapPolicy(swap_prob=prob), dummy_image=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch = assert_matches_processor(collator, examples)
            text = TokenSwapCollator(processor, tiny_store, arm="text", dummy_image=False)(examples)
        assert targets(batch, processor.tokenizer) == targets(text, processor.tokenizer)

    check()


# ---------------------------------------------------------------------------- Qwen2's real tokenizer
@pytest.mark.parametrize("family", REAL_TOKENIZER_FAMILIES)
def test_real_tokenizer_equivalence(family, family_processor, tiny_store, swap_samples):
    processor = family_processor(family, "qwen")
    assert len(processor.tokenizer) == 151669 and processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == 151655
    collator = TokenSwapCollator(processor, tiny_store, SwapPolicy(swap_prob=1.0), dummy_image=False)
    assert_matches_processor(collator, [*varied_examples(), *swap_samples[:4]])


@pytest.mark.parametrize("family", REAL_TOKENIZER_FAMILIES)
def test_real_tokenizer_straddling_newline_is_learned(family, family_processor, tiny_store):
    tok = family_processor(family, "qwen").tokenizer
    collator = TokenSwapCollator(family_processor(family, "qwen"), tiny_store, dummy_image=False)
    batch = collator([sample("n", "Say yes.", "\nYes")])
    ids = batch["input_ids"][0].tolist()
    nn = tok.convert_tokens_to_ids("ĊĊ")  # "\n\n": the header's newline merged with the answer's
    at = ids.index(nn)
    assert tok.decode(ids[at - 2: at]) == "<|im_start|>assistant"  # it straddles header and answer
    assert batch["labels"][0, at] == nn  # ... and is a target: it carries the answer's first character
    assert targets(batch, tok) == ["\n\nYes<|im_end|>"]
    assert_matches_processor(collator, [sample("n", "Say yes.", "\nYes")])


@pytest.mark.parametrize("family", REAL_TOKENIZER_FAMILIES)
def test_real_tokenizer_text_next_to_a_swap_tokenizes_as_the_processor_does(family, family_processor, tiny_store):
    tok = family_processor(family, "qwen").tokenizer
    processor = family_processor(family, "qwen")
    u = "We concat(cat) strings."
    first, second = u.index("cat"), u.index("(cat") + 1
    ex = sample("c", u, concepts=[{"message": 0, "start": first, "end": first + 3, "key": "cat"},
                                  {"message": 0, "start": second, "end": second + 3, "key": "cat"}])
    text_arm = TokenSwapCollator(processor, tiny_store, arm="text", dummy_image=False)([ex])["input_ids"][0].tolist()
    swapped = assert_matches_processor(
        TokenSwapCollator(processor, tiny_store, SwapPolicy(swap_prob=1.0), dummy_image=False), [ex]
    )["input_ids"][0].tolist()
    concat, paren = tok.convert_tokens_to_ids("Ġconcat"), tok.convert_tokens_to_ids("(cat")
    # Unswapped, " concat" and "(cat" are single tokens; swapping "cat" leaves " con" and "(" beside the images.
    assert concat in text_arm and paren in text_arm
    assert concat not in swapped and paren not in swapped
    assert tok.convert_tokens_to_ids("Ġcon") in swapped and tok.convert_tokens_to_ids("(") in swapped
