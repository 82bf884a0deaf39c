"""Per-model settings of each benchmark's release, applied by model family or name, each with its source.

The releases evaluate some models differently from the rest, and a reproduction that skips that
does not measure what the paper measured:

==========  ==========================  =====================================================  =====================
benchmark   models                      setting                                                source
==========  ==========================  =====================================================  =====================
tokenswap   Qwen2.5-VL                  ``max_new_tokens`` 128 (others: 2048)                  TokenSwap task file
tokenswap   Qwen3-VL (incl. MoE,        every image resized to about 100,352 px, sides         TokenSwap task file
            Thinking)                   multiples of 32, bicubic (processor resize off)
crossmath   Qwen3.5                     thinking off (``enable_thinking=False``) unless        CrossMath inference
                                        ``--thinking``
any         Qwen3.5, ``--scorer         thinking off, so the letter is scored where an         tokenswap (issue 26)
            loglik``                    answer without reasoning starts
==========  ==========================  =====================================================  =====================

Sources: "TokenSwap task file" is github.com/DongXzz/TokenSwap ``lmms_eval_tasks/tokenswap/_default_template_yaml``
(``model_specific_generation_kwargs.qwen2_5_vl`` and ``lmms_eval_specific_kwargs.qwen3_vl``; the resize itself is
``_resize`` in ``utils.py``); "CrossMath inference" is github.com/xuyige/CrossMath ``batch_inference_qwen35.py``
(``enable_thinking=args.thinking``, ``--thinking`` off by default).

The family comes from the checkpoint's ``model_type`` (``hf`` backend) or, for an endpoint, from the
served model's name (``Qwen/Qwen2.5-VL-7B-Instruct``, ``qwen3-vl-8b``, ...). Every setting can be
overridden on the command line (``--max-new-tokens``, ``--image-pixels``, ``--thinking``) or switched off
(``--no-model-settings``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from PIL import Image

__all__ = [
    "SOURCES",
    "ModelSettings",
    "family_from_name",
    "openai_reasoning_fields",
    "release_settings",
    "resize_to_pixels",
]

SOURCES = {
    "tokenswap": "github.com/DongXzz/TokenSwap lmms_eval_tasks/tokenswap/_default_template_yaml",
    "crossmath": "github.com/xuyige/CrossMath batch_inference_qwen35.py",
    "loglik": "tokenswap: the answer letter is scored after an empty think block, where training puts it",
}

# Served names seen for each family (hub ids, vLLM --served-model-name defaults, API aliases).
# "2.5" may be written 2.5, 2_5, 2p5 or 25 in a folder name (qwen25vl-7b).
_NAME_PATTERNS = [
    ("qwen2_5_vl", re.compile(r"qwen[-_ ]?2[._p]?5[-_ ]?vl", re.I)),
    ("qwen2_vl", re.compile(r"qwen[-_ ]?2[-_ ]?vl", re.I)),
    ("qwen3_vl", re.compile(r"qwen[-_ ]?3[-_ ]?vl", re.I)),
    ("qwen3_5", re.compile(r"qwen[-_ ]?3[._p]5", re.I)),
]


def family_from_name(name: str) -> str | None:
    """The Qwen family a served model's name belongs to (MoE variants map to their dense family), or None.

    >>> family_from_name("Qwen/Qwen2.5-VL-7B-Instruct"), family_from_name("qwen3-vl-30b-a3b-thinking")
    ('qwen2_5_vl', 'qwen3_vl')
    >>> family_from_name("/srv/models/qwen25vl-7b/"), family_from_name("gpt-4o") is None
    ('qwen2_5_vl', True)
    """
    # Any path component may carry the family (a model served under /models/<name>/snapshots/<sha>); the last one
    # that does wins (the most specific).
    for component in reversed([c for c in re.split(r"[/\\]", name) if c] or [name]):
        for family, pattern in _NAME_PATTERNS:
            if pattern.search(component):
                return family
    return None


# OpenAI's reasoning models (o1, o3, o4-mini, GPT-5.x) refuse `max_tokens` (they take `max_completion_tokens`,
# which also bounds the hidden reasoning) and any temperature but the default: platform.openai.com/docs/guides/reasoning.
_OPENAI_REASONING = re.compile(r"^(openai/)?(o\d|gpt-5)", re.I)


def openai_reasoning_fields(name: str, max_new_tokens: int) -> dict | None:
    """Payload fields for an OpenAI reasoning model's chat request, or None for any other model.

    They decode with the model's own sampling (no temperature 0 exists for them), so two runs can differ.

    >>> openai_reasoning_fields("gpt-5-mini", 128)
    {'max_tokens': None, 'temperature': None, 'max_completion_tokens': 128}
    >>> openai_reasoning_fields("gpt-4o", 128) is None
    True
    """
    if not _OPENAI_REASONING.match(name):
        return None
    return {"max_tokens": None, "temperature": None, "max_completion_tokens": max_new_tokens}


def _dense(family: str | None) -> str | None:
    return family.removesuffix("_moe") if family else family


@dataclass(frozen=True)
class ModelSettings:
    """What a benchmark's release does differently for one model.

    Attributes:
        family: the family the settings were chosen for (None: no family recognised).
        max_new_tokens: generation budget (None: the benchmark's default).
        image_pixels: resize every image to about this many pixels (None: images as they are).
        image_factor: the resized sides are multiples of this.
        chat_template_kwargs: template variables sent with every request (``enable_thinking``).
        applied: one line per setting that differs from the benchmark's default, naming its source.
    """

    family: str | None = None
    max_new_tokens: int | None = None
    image_pixels: int | None = None
    image_factor: int = 32
    chat_template_kwargs: dict = field(default_factory=dict)
    applied: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """JSON-able, for the run's summary."""
        return {
            "family": self.family,
            "max_new_tokens": self.max_new_tokens,
            "image_pixels": self.image_pixels,
            "image_factor": self.image_factor if self.image_pixels else None,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
            "applied": list(self.applied),
        }


def release_settings(
    benchmark: str,
    family: str | None,
    scorer: str = "generate",
    thinking: bool | None = None,
    enabled: bool = True,
) -> ModelSettings:
    """The release's settings for ``family`` on ``benchmark`` (``tokenswap``, ``crossmath`` or ``rest``).

    Args:
        benchmark: which release.
        family: a tokenswap family name (``qwen2_5_vl``, ``qwen3_vl_moe``, ...) or None.
        scorer: ``generate`` or ``loglik`` (loglik turns Qwen3.5's thinking off).
        thinking: ``--thinking`` / ``--no-thinking`` when given (overrides the release's choice).
        enabled: False returns no settings at all (``--no-model-settings``), except an explicit ``thinking``.

    >>> release_settings("tokenswap", "qwen2_5_vl").max_new_tokens
    128
    >>> release_settings("tokenswap", "qwen3_vl_moe").image_pixels
    100352
    >>> release_settings("crossmath", "qwen3_5").chat_template_kwargs
    {'enable_thinking': False}
    """
    if benchmark not in ("tokenswap", "crossmath", "rest"):
        raise ValueError(f"benchmark must be tokenswap, crossmath or rest, got {benchmark!r}")
    dense = _dense(family)
    settings = ModelSettings(family=family)
    applied: list[str] = []
    if enabled and benchmark == "tokenswap" and dense == "qwen2_5_vl":
        settings = replace(settings, max_new_tokens=128)
        applied.append(f"max_new_tokens 128 for Qwen2.5-VL ({SOURCES['tokenswap']}: model_specific_generation_kwargs)")
    if enabled and benchmark == "tokenswap" and dense == "qwen3_vl":
        settings = replace(settings, image_pixels=100_352, image_factor=32)
        applied.append(
            "images resized to about 100,352 px, sides multiples of 32, bicubic, for Qwen3-VL "
            f"({SOURCES['tokenswap']}: lmms_eval_specific_kwargs)"
        )
    kwargs: dict = {}
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
        applied.append(f"enable_thinking={thinking} (--{'' if thinking else 'no-'}thinking)")
    elif enabled and dense == "qwen3_5" and benchmark == "crossmath":
        kwargs["enable_thinking"] = False
        applied.append(f"thinking off for Qwen3.5 ({SOURCES['crossmath']}: --thinking defaults to off)")
    elif enabled and dense == "qwen3_5" and scorer == "loglik":
        kwargs["enable_thinking"] = False
        applied.append(f"thinking off for Qwen3.5 under loglik ({SOURCES['loglik']})")
    return replace(settings, chat_template_kwargs=kwargs, applied=tuple(applied))


def resize_to_pixels(image: Image.Image, pixels: int, factor: int = 32) -> Image.Image:
    """Resize to about ``pixels`` pixels with both sides multiples of ``factor``, bicubic (the TokenSwap release's
    Qwen3-VL resize: Qwen smart-resize with min = max = ``pixels``; smaller images are enlarged).

    >>> resize_to_pixels(Image.new("RGB", (640, 480)), 100_352).size
    (352, 256)
    >>> resize_to_pixels(Image.new("RGB", (56, 56)), 100_352).size
    (320, 320)
    """
    width, height = image.size
    if width * height > pixels:
        beta = math.sqrt(width * height / pixels)
        new_h = max(factor, math.floor(height / beta / factor) * factor)
        new_w = max(factor, math.floor(width / beta / factor) * factor)
    else:
        beta = math.sqrt(pixels / (width * height))
        new_h = math.ceil(height * beta / factor) * factor
        new_w = math.ceil(width * beta / factor) * factor
    return image.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
