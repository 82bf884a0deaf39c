"""The Qwen-VL model families tokenswap supports: one explicit table.

Each :class:`Family` says which transformers classes load the model, which chat template its
Instruct checkpoints ship and how that template renders a conversation (default system prompt or
none, trimmed contents, Qwen3.5's think block), so that :class:`~tokenswap.collator.TokenSwapCollator`
can render exactly what ``processor.apply_chat_template`` would. Image geometry (patch size, merge
size) is read from the processor itself; :attr:`Family.image_processor_defaults` only records what
the released checkpoints' ``preprocessor_config.json`` sets, for the tiny test checkpoints.
:func:`load_checkpoint` loads a checkpoint of any family (tiny test folders and released ones alike).

>>> family_of("qwen2_5_vl").model_class
'Qwen2_5_VLForConditionalGeneration'
>>> family_of("qwen3_vl").default_system_prompt is None
True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from tokenswap.errors import InputError
from tokenswap.files import read_json_object

__all__ = [
    "FAMILIES",
    "QWEN2VL_CHAT_TEMPLATE",
    "QWEN3VL_CHAT_TEMPLATE",
    "QWEN3_5_CHAT_TEMPLATE",
    "VISION_TOKENS",
    "CHECKPOINT_FIX",
    "WEIGHT_FILES",
    "Family",
    "UnsupportedFamilyError",
    "check_checkpoint",
    "family_of",
    "load_checkpoint",
    "render_conversation",
]

VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
"""Vision special tokens, the same strings in every supported family."""

_IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"


def _template(name: str) -> str:
    """A released chat template, kept byte for byte as ``tokenswap/assets/chat_templates/NAME.jinja``."""
    return (resources.files("tokenswap") / "assets" / "chat_templates" / f"{name}.jinja").read_bytes().decode("utf-8")


# Transcribed from public copies of the released files (the .jinja assets are data, not code: edit them only to
# follow a new release, byte for byte). Qwen/Qwen2-VL-7B-Instruct and Qwen/Qwen2.5-VL-7B-Instruct ship the same
# template (chat_template.json).
QWEN2VL_CHAT_TEMPLATE = _template("qwen2_vl")
# Qwen/Qwen3-VL-8B-Instruct chat_template.json (the whole Qwen3-VL Instruct line, dense and MoE, ships it). No
# default system message.
QWEN3VL_CHAT_TEMPLATE = _template("qwen3_vl")
# Qwen3.5 (tokenizer_config.json / chat_template.jinja of the releases; the copy was published as Qwen/Qwen3.5-27B's,
# and Qwen3.5-9B and the MoE releases ship the same file). Contents are trimmed; assistant turns after the last user
# query get a think block.
QWEN3_5_CHAT_TEMPLATE = _template("qwen3_5")

_QWEN3_PIXELS = {"patch_size": 16, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


class UnsupportedFamilyError(ValueError):
    """A model, config or processor outside :data:`FAMILIES`."""


@dataclass(frozen=True)
class Family:
    """One Qwen-VL model family.

    Attributes:
        name: key in :data:`FAMILIES` (the main ``config.model_type``).
        model_types: ``config.model_type`` values that belong to the family.
        model_class: transformers class that loads the checkpoints (what ``AutoModelForImageTextToText`` picks).
        base_model_class: transformers class holding ``get_rope_index`` (the 3D M-RoPE positions).
        modeling_module: module defining both classes.
        processor_class: the family's transformers processor class.
        tokenizer_class: the tokenizer class its releases use.
        default_system_prompt: system message the template inserts when a conversation has none;
            ``None`` where the template inserts nothing.
        chat_template: the Instruct releases' chat template.
        dialect: how the template renders messages, for :func:`render_conversation`: ``"qwen2_vl"``
            (default system prompt, raw contents), ``"qwen3_vl"`` (no default system prompt, images only in
            user turns), ``"qwen3_5"`` (no default system prompt, trimmed contents, a think block before the
            assistant turns after the last user message, no images in system turns).
        image_roles: roles whose images the template renders (elsewhere it drops or rejects them).
        image_processor_defaults: what the releases' ``preprocessor_config.json`` sets beyond the
            ``Qwen2VLImageProcessor`` defaults (used by the tiny test checkpoints).
        extra_tokens: added (non-special) tokens the template writes, e.g. Qwen3.5's think tags.
        example_checkpoints: hub ids of released Instruct checkpoints.
    """

    name: str
    model_types: tuple[str, ...]
    model_class: str
    base_model_class: str
    modeling_module: str
    processor_class: str
    tokenizer_class: str
    default_system_prompt: str | None
    chat_template: str
    dialect: Literal["qwen2_vl", "qwen3_vl", "qwen3_5"]
    image_roles: tuple[str, ...] = ("system", "user", "assistant")
    image_processor_defaults: dict[str, Any] = field(default_factory=dict)
    extra_tokens: tuple[str, ...] = ()
    example_checkpoints: tuple[str, ...] = ()

    def model_cls(self):
        """The transformers model class (imported on demand)."""
        import transformers

        return getattr(transformers, self.model_class)


def _family(name: str, model_class: str, base: str, module: str, **kw) -> Family:
    return Family(name=name, model_types=(name,), model_class=model_class, base_model_class=base,
                  modeling_module=f"transformers.models.{module}.modeling_{module}", **kw)


_QWEN2 = dict(processor_class="", tokenizer_class="Qwen2Tokenizer", default_system_prompt="You are a helpful assistant.",
              chat_template=QWEN2VL_CHAT_TEMPLATE, dialect="qwen2_vl")
_QWEN3VL = dict(processor_class="Qwen3VLProcessor", tokenizer_class="Qwen2Tokenizer", default_system_prompt=None,
                chat_template=QWEN3VL_CHAT_TEMPLATE, dialect="qwen3_vl", image_roles=("user",),
                image_processor_defaults=_QWEN3_PIXELS)
_QWEN3_5 = dict(processor_class="Qwen3VLProcessor", tokenizer_class="Qwen3_5Tokenizer", default_system_prompt=None,
                chat_template=QWEN3_5_CHAT_TEMPLATE, dialect="qwen3_5", image_roles=("user", "assistant"),
                image_processor_defaults=_QWEN3_PIXELS, extra_tokens=("<think>", "</think>"))

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        _family("qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLModel", "qwen2_vl",
                **{**_QWEN2, "processor_class": "Qwen2VLProcessor"},
                example_checkpoints=("Qwen/Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-7B-Instruct")),
        _family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLModel", "qwen2_5_vl",
                **{**_QWEN2, "processor_class": "Qwen2_5_VLProcessor"},
                example_checkpoints=("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct")),
        _family("qwen3_vl", "Qwen3VLForConditionalGeneration", "Qwen3VLModel", "qwen3_vl", **_QWEN3VL,
                example_checkpoints=("Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct")),
        _family("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeModel", "qwen3_vl_moe", **_QWEN3VL,
                example_checkpoints=("Qwen/Qwen3-VL-30B-A3B-Instruct",)),
        _family("qwen3_5", "Qwen3_5ForConditionalGeneration", "Qwen3_5Model", "qwen3_5", **_QWEN3_5,
                example_checkpoints=("Qwen/Qwen3.5-9B",)),
        _family("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeModel", "qwen3_5_moe", **_QWEN3_5,
                example_checkpoints=("Qwen/Qwen3.5-35B-A3B",)),
    ]
}
"""Supported families by name; MoE variants share their dense sibling's template and processor."""


def _unsupported(what: str) -> UnsupportedFamilyError:
    return UnsupportedFamilyError(
        f"{what} is not a supported model family; tokenswap supports {', '.join(FAMILIES)} "
        "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and their MoE variants)"
    )


def family_of(obj: Any) -> Family:
    """The family of a ``model_type`` string, a config, a model or a processor.

    A processor does not say whether its model is dense or MoE (they share processor, tokenizer and
    template): it maps to the dense family, which renders and computes positions identically.

    Raises:
        UnsupportedFamilyError: for anything outside :data:`FAMILIES`; the message lists the supported ones.
    """
    if isinstance(obj, Family):
        return obj
    if isinstance(obj, str):
        for f in FAMILIES.values():
            if obj in f.model_types:
                return f
        raise _unsupported(f"model_type {obj!r}")
    config = getattr(obj, "config", obj)
    model_type = getattr(config, "model_type", None)
    if isinstance(model_type, str) and model_type:
        return family_of(model_type)
    if hasattr(obj, "tokenizer") and hasattr(obj, "image_processor"):
        return _family_of_processor(obj)
    raise _unsupported(f"{type(obj).__name__} object")


def _family_of_processor(processor: Any) -> Family:
    cls = type(processor).__name__
    candidates = [f for f in FAMILIES.values() if f.processor_class == cls and not f.name.endswith("_moe")]
    if not candidates:
        raise _unsupported(f"processor {cls}")
    if len(candidates) == 1:
        return candidates[0]
    # Qwen3-VL and Qwen3.5 share Qwen3VLProcessor; their tokenizers and templates differ.
    tok = type(processor.tokenizer).__name__
    by_tok = [f for f in candidates if f.tokenizer_class == tok]
    if len(by_tok) == 1:
        return by_tok[0]
    template = processor.chat_template or ""
    return FAMILIES["qwen3_5"] if "<think>" in template else FAMILIES["qwen3_vl"]


def _body(content: str | Sequence[dict]) -> tuple[str, int]:
    """Message content -> rendered text and its number of images."""
    if isinstance(content, str):
        return content, 0
    parts, n = [], 0
    for p in content:
        if p["type"] == "image":
            parts.append(_IMAGE_BLOCK)
            n += 1
        elif p["type"] == "text":
            parts.append(p["text"])
        else:
            raise ValueError(f"content part of type {p['type']!r}; TokenSwapCollator renders 'text' and 'image' parts")
    return "".join(parts), n


def render_conversation(
    family: Family, messages: Sequence[dict], system_prompt: str | None
) -> tuple[str, list[tuple[int, int]]]:
    """Render a conversation as ``family``'s chat template does (no generation prompt).

    Args:
        family: whose template rules to follow.
        messages: ``[{"role", "content"}]`` with ``content`` a str or ``[{"type": "text"|"image", ...}]``.
        system_prompt: system message inserted when the conversation has none (``None``: insert none).

    Returns:
        The template text (one ``<|image_pad|>`` per image) and the learnable character ranges: each
        assistant turn from just after its ``<|im_start|>assistant\\n`` header through its ``<|im_end|>``
        (for Qwen3.5 this includes the think block the template writes).

    Raises:
        ValueError: an image in a role whose images the template does not render, or a conversation the
            template rejects or silently drops (no user message for Qwen3.5; a system message after the first
            for Qwen3-VL and Qwen3.5).
    """
    out: list[str] = []
    learn: list[tuple[int, int]] = []
    pos = 0

    def emit(text: str) -> None:
        nonlocal pos
        out.append(text)
        pos += len(text)

    if messages and messages[0]["role"] != "system" and system_prompt is not None:
        emit(f"<|im_start|>system\n{system_prompt}<|im_end|>\n")
    last_query = len(messages) - 1
    if family.dialect == "qwen3_5":
        # The template's "last query": the last user message that is not a wrapped tool response.
        users = [
            i for i, m in enumerate(messages) if m["role"] == "user"
            and not ((b := _body(m["content"])[0].strip()).startswith("<tool_response>") and b.endswith("</tool_response>"))
        ]
        if not users:
            raise ValueError("the Qwen3.5 chat template needs at least one user message (it raises otherwise)")
        last_query = users[-1]
    for i, m in enumerate(messages):
        role = m["role"]
        body, n_images = _body(m["content"])
        if n_images and role not in family.image_roles:
            raise ValueError(
                f"message {i} ({role}) has an image, but the {family.name} chat template renders images only in "
                f"{' and '.join(family.image_roles)} messages; swap concepts of those roles only (SwapPolicy.roles)"
            )
        if role == "system" and i > 0 and family.dialect != "qwen2_vl":
            raise ValueError(
                f"message {i} is a system message; the {family.name} chat template accepts one only as the first message"
            )
        if family.dialect == "qwen3_5":
            body = body.strip()
            if role == "assistant":
                reasoning = ""
                if "</think>" in body:
                    reasoning = body.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                    body = body.split("</think>")[-1].lstrip("\n")
                if i > last_query:
                    body = f"<think>\n{reasoning.strip()}\n</think>\n\n{body}"
        head = f"<|im_start|>{role}\n"
        emit(head)
        if role == "assistant":
            learn.append((pos, pos + len(body) + len("<|im_end|>")))
        emit(f"{body}<|im_end|>\n")
    return "".join(out), learn


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""The weight files ``from_pretrained`` looks for in a local checkpoint folder (one suffices)."""

CHECKPOINT_FIX = ("pass a checkpoint folder a run saved whole (its config.json, weights and processor files: "
                  "output_dir or one of its checkpoint-N folders), or a hub id")


def check_checkpoint(path: str | os.PathLike, what: str = "checkpoint") -> None:
    """A local checkpoint folder whose ``config.json`` reads as an object with a ``model_type`` and which holds
    weights, checked without loading anything (transformers would report a cut ``config.json`` as "not a valid
    JSON file", a folder without weights deep in ``from_pretrained``)."""
    config_path = os.path.join(path, "config.json")
    config = read_json_object(config_path, f"{what} config", CHECKPOINT_FIX)
    if not isinstance(config.get("model_type"), str):
        raise InputError(f"{what} config {config_path!r} has no `model_type`; {CHECKPOINT_FIX}")
    if not any(os.path.isfile(os.path.join(path, name)) for name in WEIGHT_FILES):
        raise InputError(f"{what} {str(path)!r} holds no weights (none of {', '.join(WEIGHT_FILES)}); "
                         f"{CHECKPOINT_FIX}")


def load_checkpoint(path: str | os.PathLike, dtype=None, attn_implementation: str | None = None):
    """Load a checkpoint folder or hub id of any supported family: ``(model, processor)``.

    The same call serves the tiny test checkpoints and the released ones (``Qwen/Qwen2-VL-7B-Instruct``,
    ``Qwen/Qwen3-VL-8B-Instruct``, ``Qwen/Qwen3.5-9B``, ...): ``AutoModelForImageTextToText`` picks the
    class :data:`tokenswap.families.FAMILIES` names.

    Raises:
        InputError: a local folder whose ``config.json`` is cut, not an object or has no ``model_type``, that
            holds no weights, or whose weights or processor files do not load (a cut copy); names the folder.
        UnsupportedFamilyError: a model type outside the family table.
    """
    import transformers
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoProcessor

    local = os.path.isdir(path)
    if local:
        check_checkpoint(path)
    # The family table picks the class (and refuses unsupported models, naming the supported families).
    family = family_of(AutoConfig.from_pretrained(path).model_type)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    try:
        processor = AutoProcessor.from_pretrained(path)
        model = getattr(transformers, family.model_class).from_pretrained(path, dtype=dtype or "auto", **kwargs)
    except (OSError, ValueError, EOFError, SafetensorError) as e:  # a cut or partial copy of the folder
        if not local:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise InputError(f"checkpoint {str(path)!r} does not load ({type(e).__name__}: {first}); "
                         f"{CHECKPOINT_FIX}") from None
    return model, processor
