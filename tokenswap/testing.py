"""Tiny Qwen-VL checkpoints built offline, for tests, benchmarks and the demo.

:func:`build_tiny_model` writes a folder that loads with ``AutoProcessor.from_pretrained`` and
``AutoModelForImageTextToText.from_pretrained`` exactly like a released Instruct checkpoint of the
chosen family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): the family's tokenizer class, special tokens
and released chat template, its real image and video processors (Qwen3-VL / Qwen3.5 with the released
16-pixel patches), and a random-weight model of its real architecture at toy width. The tokenizer is
either a byte-level BPE trained locally on a few sentences (small and fast) or, with
``tokenizer="qwen"``, Qwen2's real 151,643-rank vocabulary (:mod:`tokenswap.qwen_tokenizer`).
:func:`build_tiny_qwen2vl` is the original Qwen2-VL kit most tests use. Nothing is downloaded.
:func:`build_tiny_store` and :func:`build_tiny_bench` write the tiny image store and bench;
:func:`assert_matches_processor` checks a collator's batch against the processor's own; :class:`ScriptedChatModel`
is a chat model in process whose replies a test scripts. ``python -m tokenswap.testing DIR`` writes the kit the docs
use; its tokenizer corpus is package data, so an installed package and a checkout write the same files.

The kit for users' own tests and for this project's tests, benchmarks and demo; the project's test servers and
fault fixtures are its tests' own (``tests/support.py`` of a checkout), not shipped.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "QWEN2VL_CHAT_TEMPLATE",
    "QWEN2VL_SPECIAL_TOKENS",
    "ScriptedChatModel",
    "TINY_FAMILIES",
    "TINY_MOE_FAMILIES",
    "assert_matches_processor",
    "build_tiny_bench",
    "build_tiny_model",
    "build_tiny_qwen2vl",
    "build_tiny_store",
    "official_batch",
    "tiny_config",
    "tiny_corpus",
    "tiny_qwen2vl_config",
    "train_tokenizer",
]

QWEN2VL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# The Qwen2-VL-Instruct template, branching on ``type`` only: ``datasets`` fills absent keys
# with None, so the official template's ``'image' in content`` test would misfire on rows
# that came through a Dataset (a text part would render as an image). It renders every conversation
# of ``{"type": ...}`` parts exactly as the released template
# (:data:`tokenswap.families.QWEN2VL_CHAT_TEMPLATE`) does; :func:`build_tiny_qwen2vl` keeps it, while
# :func:`build_tiny_model` writes the released templates of every family.
QWEN2VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_DEFAULT_CORPUS = [
    "You are a helpful assistant.",
    "The quick brown fox jumps over the lazy dog. A cat sat on the mat with an apple and a banana.",
    "Question: What color is the sky? Answer: The sky is blue. Options A. B. C. D.",
    "The following are multiple choice questions about biology, chemistry, physics and history.",
    "Answer the question by replying A, B, C or D.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe \u4f60\u597d \u3053\u3093\u306b\u3061\u306f \U0001f600 \u2014 \u00bd",
    "0123456789 + - * / = ( ) [ ] { } < > ? ! , . ; : ' \" | \\ @ # $ % ^ & ~ `",
]


def train_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 1024, extra_tokens: Iterable[str] = ()):
    """Train a byte-level BPE tokenizer with the Qwen2-VL special tokens and chat template.

    Args:
        corpus: extra training text (the tokenizer can encode any text either way, being byte level).
        vocab_size: target vocabulary size including the 256 byte tokens and special tokens.
        extra_tokens: added non-special tokens the chat template writes (e.g. ``<think>``), placed after
            the special tokens.

    Returns:
        A ``PreTrainedTokenizerFast`` (eos ``<|im_end|>``, pad ``<|endoftext|>``).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()  # as Qwen2's tokenizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=QWEN2VL_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*_DEFAULT_CORPUS, *corpus], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN2VL_SPECIAL_TOKENS[1:],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = QWEN2VL_CHAT_TEMPLATE
    extra = list(extra_tokens)
    if extra:
        from tokenizers import AddedToken

        fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra])
    return fast


_TINY_HEAD_DIM = 16


def _tiny_text_config(
    ids: dict[str, int],
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    *,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    rope_theta: float = 10000.0,
    mrope_section: list[int] | None = None,
) -> dict:
    """The language-model part every tiny family shares: by default 16-dim heads, half as many KV heads, an MLP
    twice the width, tied embeddings (the keyword arguments: :func:`tiny_qwen2vl_config`'s ``text_shape``)."""
    dim = head_dim or (_TINY_HEAD_DIM if num_heads is None else hidden_size // num_heads)
    if num_heads is None:
        num_heads = hidden_size // _TINY_HEAD_DIM
    if mrope_section is None:
        # mrope_section splits head_dim/2 rotary frequencies over (temporal, height, width).
        half = dim // 2
        mrope_section = [half - 2 * (half // 3), half // 3, half // 3]
    rope = {"rope_type": "default", "rope_theta": rope_theta, "mrope_section": list(mrope_section)}
    text = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or max(1, num_heads // 2),
        max_position_embeddings=32768,
        rope_parameters=rope,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    if head_dim is not None:  # written to the config only when asked for (otherwise hidden_size / num_heads)
        text["head_dim"] = head_dim
    return text


def tiny_qwen2vl_config(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    vision_depth: int = 2,
    *,
    vision_embed_dim: int = 32,
    vision_num_heads: int = 2,
    vision_mlp_ratio: int = 2,
    **text_shape,
):
    """A ``Qwen2VLConfig`` with the real architecture, by default at toy width (about 0.25M parameters + embeddings).

    The keyword-only arguments set other shapes (the benchmarks' larger models, up to Qwen2-VL-2B's); left out,
    the toy defaults apply.

    Args:
        tokenizer: supplies the vocabulary size and the special-token ids.
        hidden_size: language model width (with the default heads, a multiple of 16).
        num_layers: language model depth.
        vision_depth: vision tower blocks.
        vision_embed_dim: vision tower width.
        vision_num_heads: vision tower heads.
        vision_mlp_ratio: vision MLP width over ``vision_embed_dim``.
        **text_shape: the language model's other shapes:

            - ``num_heads``: query heads (default ``hidden_size / 16``: 16-dim heads).
            - ``num_kv_heads``: key/value heads (default half the query heads, at least one).
            - ``head_dim``: per-head width, written to the config only when given; keep it
              ``hidden_size / num_heads`` (Qwen2-VL's attention uses that ratio, its rotary embedding the
              written value).
            - ``intermediate_size``: MLP width (default ``2 * hidden_size``).
            - ``rope_theta``: rotary base (default 10000.0).
            - ``mrope_section``: rotary frequencies for (temporal, height, width), summing to ``head_dim / 2``
              (default, with ``h = head_dim / 2``: ``[h - 2 * (h // 3), h // 3, h // 3]``).
    """
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN2VL_SPECIAL_TOKENS}
    text = _tiny_text_config(ids, len(tokenizer), hidden_size, num_layers, **text_shape)
    return Qwen2VLConfig(
        text_config=text,
        vision_config=dict(
            depth=vision_depth,
            embed_dim=vision_embed_dim,
            hidden_size=hidden_size,
            num_heads=vision_num_heads,
            mlp_ratio=vision_mlp_ratio,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def build_tiny_qwen2vl(
    out_dir: str | os.PathLike,
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    min_pixels: int = 56 * 56,
    max_pixels: int = 224 * 224,
    seed: int = 0,
    **shape,
) -> Path:
    """Write a tiny random-weight Qwen2-VL checkpoint (model + processor) to ``out_dir``.

    Args:
        out_dir: destination folder; reused as is if it already holds a tiny checkpoint.
        corpus: text to train the tokenizer on (e.g. the training data), for realistic token counts.
        vocab_size: tokenizer vocabulary size.
        hidden_size: language model width (with the default heads, a multiple of 16).
        num_layers: language model depth.
        min_pixels: image processor lower bound (pixels per image).
        max_pixels: image processor upper bound; always set, since the default allows 16k tokens per image.
        seed: initialisation seed.
        **shape: other shapes, as :func:`tiny_qwen2vl_config`'s keyword arguments (``num_heads``,
            ``num_kv_heads``, ``head_dim``, ``intermediate_size``, ``rope_theta``, ``mrope_section``,
            ``vision_depth``, ``vision_embed_dim``, ``vision_num_heads``, ``vision_mlp_ratio``); recorded in
            ``tiny_qwen2vl.json``.

    Returns:
        ``out_dir`` as a Path.
    """
    import torch
    from transformers import Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    out = Path(out_dir)
    if (out / "tiny_qwen2vl.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    image_processor = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    video_processor = Qwen2VLVideoProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN2VL_CHAT_TEMPLATE,
    )
    torch.manual_seed(seed)
    config = tiny_qwen2vl_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers, **shape)
    model = Qwen2VLForConditionalGeneration._from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "tiny_qwen2vl.json").write_text(json.dumps(
        {"vocab_size": len(tokenizer), "hidden_size": hidden_size, "num_layers": num_layers, "seed": seed, **shape}
    ))
    return out


TINY_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
"""The dense families :func:`build_tiny_model` builds."""

TINY_MOE_FAMILIES = ("qwen3_vl_moe", "qwen3_5_moe")
"""MoE variants it also builds (4 experts, 2 per token); they share the dense families' templates and processors."""


def tiny_config(family: str, tokenizer, vocab_size: int, hidden_size: int = 64, num_layers: int = 2):
    """The family's real model config at toy width: 16-dim heads, two vision blocks of width 32.

    Args:
        family: one of :data:`TINY_FAMILIES` or :data:`TINY_MOE_FAMILIES`.
        tokenizer: supplies the special-token ids.
        vocab_size: embedding rows (``len(tokenizer)``, or the released 151,936 with the real vocabulary).
        hidden_size: language model width (multiple of 16).
        num_layers: language model depth (Qwen3.5: alternating linear / full attention layers, ending full).
    """
    import transformers

    from tokenswap.families import family_of

    fam = family_of(family)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN2VL_SPECIAL_TOKENS}
    text = _tiny_text_config(ids, vocab_size, hidden_size, num_layers)
    head_dim, rope = _TINY_HEAD_DIM, text["rope_parameters"]
    vision = dict(depth=2, hidden_size=32, num_heads=2, in_channels=3, spatial_merge_size=2, temporal_patch_size=2)
    if fam.name == "qwen2_vl":
        config = tiny_qwen2vl_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers)
        config.text_config.vocab_size = vocab_size
        return config
    if fam.name == "qwen2_5_vl":
        vision.update(intermediate_size=64, out_hidden_size=hidden_size, patch_size=14, window_size=56,
                      fullatt_block_indexes=[1])
    elif fam.name in ("qwen3_vl", "qwen3_vl_moe"):
        text.update(head_dim=head_dim, rope_parameters={**rope, "mrope_interleaved": True})
        vision.update(intermediate_size=64, out_hidden_size=hidden_size, patch_size=16, num_position_embeddings=64,
                      deepstack_visual_indexes=[0])
    elif fam.name in ("qwen3_5", "qwen3_5_moe"):
        text.update(
            head_dim=head_dim,
            rope_parameters={**rope, "mrope_interleaved": True, "partial_rotary_factor": 1.0},
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            layer_types=["linear_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)],
        )
        vision.update(intermediate_size=64, out_hidden_size=hidden_size, patch_size=16, num_position_embeddings=64)
    else:
        raise ValueError(f"no tiny config for family {fam.name!r}; tiny families: {', '.join(TINY_FAMILIES)}")
    if fam.name.endswith("_moe"):
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        if fam.name == "qwen3_5_moe":
            text.update(shared_expert_intermediate_size=32)
    config_cls = getattr(transformers, fam.model_class.replace("ForConditionalGeneration", "Config"))
    return config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def _family_tokenizer(family, tokenizer: str, corpus: Iterable[str], vocab_size: int):
    """The tiny kit's tokenizer as the family's own tokenizer class, with the family's template set."""
    import transformers

    if tokenizer == "qwen":
        if family.tokenizer_class != "Qwen2Tokenizer":
            raise ValueError(
                f"tokenizer='qwen' is Qwen2's vocabulary; {family.name} uses another ({family.tokenizer_class}) that "
                "no package ships: use tokenizer='trained'"
            )
        from tokenswap.qwen_tokenizer import build_qwen_tokenizer

        tok = build_qwen_tokenizer()
    elif tokenizer == "trained":
        trained = train_tokenizer(corpus, vocab_size=vocab_size, extra_tokens=family.extra_tokens)
        model = __import__("json").loads(trained.backend_tokenizer.to_str())["model"]
        cls = getattr(transformers, family.tokenizer_class)
        # The family's class brings its own pre-tokenizer (Qwen2's / Qwen3.5's split regex) over the trained merges.
        tok = cls(vocab=model["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                                for m in model["merges"]],
                  eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=32768,
                  clean_up_tokenization_spaces=False)
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2VL_SPECIAL_TOKENS])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.extra_tokens])
        tok.eos_token = "<|im_end|>"
        tok.add_special_tokens({"additional_special_tokens": QWEN2VL_SPECIAL_TOKENS[1:]})
        for t in (*QWEN2VL_SPECIAL_TOKENS, *family.extra_tokens):
            if tok.convert_tokens_to_ids(t) != trained.convert_tokens_to_ids(t):
                raise RuntimeError(f"{t} moved from id {trained.convert_tokens_to_ids(t)} to {tok.convert_tokens_to_ids(t)}")
    else:
        raise ValueError(f"tokenizer must be 'trained' or 'qwen', got {tokenizer!r}")
    tok.chat_template = family.chat_template
    return tok


def build_tiny_model(
    out_dir: str | os.PathLike,
    family: str = "qwen2_vl",
    tokenizer: str = "trained",
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    seed: int = 0,
) -> Path:
    """Write a tiny random-weight checkpoint of ``family`` (model + processor with its released chat template).

    Args:
        out_dir: destination folder; reused as is if it already holds a tiny checkpoint.
        family: one of :data:`TINY_FAMILIES` or :data:`TINY_MOE_FAMILIES`.
        tokenizer: ``"trained"`` (byte-level BPE trained on ``corpus``, ``vocab_size`` tokens) or ``"qwen"``
            (Qwen2's real vocabulary; the embedding then has the released 151,936 rows, so keep
            ``hidden_size`` small). Qwen3.5 has only ``"trained"``.
        corpus: text to train the tokenizer on.
        vocab_size: trained tokenizer vocabulary size.
        hidden_size: language model width (multiple of 16).
        num_layers: language model depth.
        min_pixels: image processor lower bound (default: a 2x2 grid of merged patches).
        max_pixels: image processor upper bound (default: 8x8 merged patches); always set, since the
            released default allows 16k tokens per image.
        seed: initialisation seed.

    Returns:
        ``out_dir`` as a Path.
    """
    import torch
    import transformers
    from transformers import Qwen2VLImageProcessor

    from tokenswap.families import family_of

    if family not in TINY_FAMILIES + TINY_MOE_FAMILIES:
        raise ValueError(f"family must be one of {', '.join(TINY_FAMILIES + TINY_MOE_FAMILIES)}, got {family!r}")
    fam = family_of(family)
    out = Path(out_dir)
    if (out / "tiny_model.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = _family_tokenizer(fam, tokenizer, corpus, vocab_size)
    pixels = dict(fam.image_processor_defaults)
    factor = pixels.get("patch_size", 14) * 2
    pixels.update(min_pixels=min_pixels or (2 * factor) ** 2, max_pixels=max_pixels or (8 * factor) ** 2)
    video_cls = "Qwen3VLVideoProcessor" if fam.dialect != "qwen2_vl" else "Qwen2VLVideoProcessor"
    video_module = "qwen3_vl.video_processing_qwen3_vl" if fam.dialect != "qwen2_vl" else \
        "qwen2_vl.video_processing_qwen2_vl"
    video = getattr(__import__(f"transformers.models.{video_module}", fromlist=[video_cls]), video_cls)(**pixels)
    processor = getattr(transformers, fam.processor_class)(
        image_processor=Qwen2VLImageProcessor(**pixels), tokenizer=tok, video_processor=video,
        chat_template=fam.chat_template,
    )
    if tokenizer == "qwen":
        from tokenswap.qwen_tokenizer import QWEN_MODEL_VOCAB_SIZE

        rows = QWEN_MODEL_VOCAB_SIZE
    else:
        rows = len(tok)
    torch.manual_seed(seed)
    config = tiny_config(family, tok, rows, hidden_size=hidden_size, num_layers=num_layers)
    model = fam.model_cls()._from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "tiny_model.json").write_text(json.dumps({
        "family": family, "tokenizer": tokenizer, "vocab_size": rows, "hidden_size": hidden_size,
        "num_layers": num_layers, "seed": seed,
    }))
    return out


def official_batch(processor, messages_list: list[list[dict]]) -> dict:
    """What the processor itself produces for interleaved conversations (right padding): the reference
    :class:`~tokenswap.collator.TokenSwapCollator` must equal."""
    texts = [processor.apply_chat_template(m, tokenize=False) for m in messages_list]
    images = [p["image"] for m in messages_list for msg in m for p in msg["content"] if p["type"] == "image"]
    return processor(text=texts, images=images or None, padding=True, return_tensors="pt")


def assert_matches_processor(collator, examples: list[dict], arm: str = "tokenswap") -> dict:
    """Collate ``examples`` and check the batch against :func:`official_batch`, token and pixel exact.

    Returns:
        The collator's batch.
    """
    import torch

    batch = collator(examples)
    ref = official_batch(collator.processor, [collator.interleaved_messages(e, arm) for e in examples])
    for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
        torch.testing.assert_close(batch[key], ref[key], rtol=0, atol=0, msg=key)
    if "pixel_values" in ref:
        torch.testing.assert_close(batch["pixel_values"], ref["pixel_values"], rtol=0, atol=0)
        torch.testing.assert_close(batch["image_grid_thw"], ref["image_grid_thw"], rtol=0, atol=0)
    else:
        assert "pixel_values" not in batch
    return batch


# Concepts of tests/assets/swap_tiny.jsonl covered by the tiny store ("dog" is left out on purpose,
# so tests see a concept without images).
TINY_STORE_CONCEPTS = ("circle", "square", "triangle", "apple", "banana", "tomato", "cat", "café")


def build_tiny_store(root: str | os.PathLike, every_concept: bool = False):
    """A small ImageStore of drawn pictures for tests and tiny configs; two images for ``apple``. ``every_concept``
    also draws ``dog``, so the store covers every concept of tests/assets/swap_tiny.jsonl (the tiny kit's store,
    which the README's tiny TokenSwap arm reads: no "has no image" warning there).

    Returns:
        The opened ``ImageStore`` (reused if ``root`` already holds one).
    """
    from PIL import Image, ImageDraw

    from tokenswap.store.image_store import ImageStore, StoreWriter

    root = Path(root)
    if (root / "store.json").exists():
        return ImageStore(root)

    def canvas(draw) -> Image.Image:
        im = Image.new("RGB", (64, 64), "white")
        draw(ImageDraw.Draw(im))
        return im

    with StoreWriter(root, info={"source": "tokenswap.testing.build_tiny_store"}) as w:
        w.add("square", canvas(lambda d: d.rectangle([12, 12, 52, 52], fill=(220, 30, 30))), source="drawn")
        w.add("circle", canvas(lambda d: d.ellipse([10, 10, 54, 54], fill=(30, 60, 220))), source="drawn")
        w.add("triangle", canvas(lambda d: d.polygon([(32, 8), (58, 56), (6, 56)], fill=(30, 170, 60))), source="drawn")
        for key, color in {"apple": "red", "banana": "yellow", "tomato": "tomato", "cat": "gray", "café": "brown"}.items():
            w.add(key, Image.new("RGB", (40, 90), color), source="solid", score=0.9)
        w.add("apple", Image.new("RGB", (120, 60), "darkred"), source="solid", score=0.5)
        if every_concept:
            w.add("dog", Image.new("RGB", (80, 50), "sienna"), source="solid", score=0.9)
    return ImageStore(root)


# The tiny bench's items: (concept swapped for its picture, question, choices, answer).
TINY_BENCH_ITEMS = (
    ("cat", "Which animal says meow, the cat or the dog?", ("cat", "dog", "both", "neither"), 0),
    ("banana", "What color is a ripe banana?", ("blue", "yellow", "black", "white"), 1),
    ("circle", "How many corners does a circle have?", ("one", "two", "three", "none"), 3),
    ("square", "How many sides does a square have?", ("three", "four", "five", "six"), 1),
    ("apple", "Does an apple grow on a tree?", ("yes", "no", "only in winter", "never"), 0),
    ("triangle", "How many sides does a triangle have?", ("two", "three", "four", "five"), 1),
)


def build_tiny_bench(root: str | os.PathLike, store) -> Path:
    """A 6-item bench in the TokenSwap-Bench hub layout whose interleaved form shows ``store``'s pictures.

    ``store`` is an ``ImageStore`` holding the concepts of :data:`TINY_BENCH_ITEMS` (:func:`build_tiny_store`'s).
    Returns ``root``.
    """
    from tokenswap.concepts import Concept
    from tokenswap.data.items import MCItem
    from tokenswap.data.tokenswap_bench import write_tokenswap_bench
    from tokenswap.eval.mc import swap_concepts

    pairs = []
    for i, (concept, question, choices, answer) in enumerate(TINY_BENCH_ITEMS):
        item = MCItem(id=f"b{i}", subject="tiny_world", question=question, choices=list(choices), answer=answer)
        start = question.index(concept)
        pairs.append((item, swap_concepts(item, [Concept(0, start, start + len(concept), concept)], store)))
    write_tokenswap_bench(pairs, root)
    return Path(root)


class ScriptedChatModel:
    """A :class:`~tokenswap.inference.ChatModel` in process whose replies come from :meth:`answer`, for tests.

    Subclass it and override :meth:`answer` (or pass ``answer``); ``stats`` counts every call as a reply, as an
    endpoint's client counts a request answered, so code that reads a model's statistics reads these too.

    Args:
        answer: ``messages -> reply text``; default: the subclass's :meth:`answer`.
    """

    def __init__(self, answer=None):
        from tokenswap.inference.types import RequestStats

        self._answer = answer
        self.stats = RequestStats(limit=1)

    def answer(self, messages: list[dict]) -> str:
        return self._answer(messages)

    def chat(self, messages: list[dict]) -> str:
        return self.request(messages).text

    def request(self, messages: list[dict], *, max_tokens: int | None = None, temperature: float | None = None,
                top_logprobs: int | None = None, extra_body: dict | None = None, use_cache: bool = True):
        from tokenswap.inference.types import Reply

        self.stats._start()
        try:
            text = self.answer(messages)
        except BaseException:
            self.stats.add(errors=1)
            raise
        finally:
            self.stats._end()
        self.stats.add(replies=1)
        return Reply(text=text)


def tiny_corpus() -> list[str]:
    """The texts the tiny kit's tokenizer learns (the messages of the tests' ``swap_tiny.jsonl``), from the package
    data ``tokenswap/assets/tiny_corpus.jsonl`` (one JSON string a line): an installed package and a checkout build
    the same tiny kit, byte for byte."""
    from importlib import resources

    text = (resources.files("tokenswap") / "assets" / "tiny_corpus.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    """``python -m tokenswap.testing DIR [--family F] [--tokenizer trained|qwen]``.

    Writes DIR/tiny-qwen2vl (no ``--family``; the model configs/tiny names) or DIR/tiny-F, and always
    DIR/tiny-store and DIR/tiny-bench: every fixture the README and the docs use, so their first line makes
    all that their later commands read. Without the eval extra (``datasets``) the bench is skipped, said in one
    line, and the exit status stays 0: training needs only the model and the store.
    """
    import argparse

    from tokenswap.script import CommandParser

    parser = CommandParser(prog="python -m tokenswap.testing", description=main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default=".cache", help="output folder (default: .cache)")
    parser.add_argument("--family", choices=TINY_FAMILIES + TINY_MOE_FAMILIES, help="write DIR/tiny-FAMILY with the family's template")
    parser.add_argument("--tokenizer", choices=("trained", "qwen"), default="trained",
                        help="trained: small local BPE; qwen: Qwen2's real vocabulary (needs dashscope)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    corpus = tiny_corpus()
    if args.family is None:
        if args.tokenizer != "trained":
            parser.error("--tokenizer qwen needs --family")
        print(build_tiny_qwen2vl(out / "tiny-qwen2vl", corpus=corpus))
    else:
        hidden = 32 if args.tokenizer == "qwen" else 64
        try:
            print(build_tiny_model(out / f"tiny-{args.family}", family=args.family, tokenizer=args.tokenizer,
                                   corpus=corpus, hidden_size=hidden))
        except (ValueError, FileNotFoundError) as e:  # e.g. --tokenizer qwen for Qwen3.5, or no dashscope
            parser.error(str(e))
    store = build_tiny_store(out / "tiny-store", every_concept=True)
    print(store.root)
    try:
        print(build_tiny_bench(out / "tiny-bench", store))
    except ImportError as e:  # a core-only install: the bench is written with `datasets` (the eval extra)
        from tokenswap.extras import missing_extra_line

        line = missing_extra_line(e, "the tiny bench", "eval")
        if line is None:
            raise
        print(f"{line} (skipped: the model and the store above are written)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from tokenswap.script import run_script

    run_script(main)
