"""TokenSwapCollator: text instruction data with concept spans swapped for images, on the fly.

The collator renders each conversation exactly as the model family's chat template would
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5: :mod:`tokenswap.families`; checked against the
processor's own template at construction), tokenizes it with one ``<|image_pad|>``
per image, expands each pad to the image's ``t·h·w / merge²`` tokens, and attaches the cached
pixels. The result is identical to ``processor(text=apply_chat_template(...), images=...)``
for the same interleaved conversation, at a fraction of the cost: pixels are processed once
per distinct image and kept in a bounded LRU cache.

One module although it is long (~790 lines): the collator is one contract (rendering, tokens, labels,
images, refusals, packing) whose parts share the sample plan and the statistics; its separable pieces
live beside it (encoding, pixel_cache, packing, families).
"""

from __future__ import annotations

import hashlib
import logging
import os
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from tokenswap.concepts import Concept, concepts_from_sample, sample_texts, text_problem
from tokenswap.encoding import TemplateEncoder
from tokenswap.families import VISION_TOKENS, Family, family_of, render_conversation
from tokenswap.images import DEFAULT_MAX_IMAGE_PIXELS, BadImageError, load_image
from tokenswap.pixel_cache import PIXEL_DTYPES, PixelCache, concat_pixels
from tokenswap.store.image_store import ImageMismatchError, ImageStore
from tokenswap.store.prepare import PreparedImageError, load_prepared, prepared_pixels, prepared_shape
from tokenswap.swap import SwapPolicy

__all__ = ["IMAGE_MARKER", "TokenSwapCollator", "encode_sample_id", "read_sample_ids"]

logger = logging.getLogger(__name__)

def _needs_escape(c: str) -> bool:
    return c == "%" or c.isspace() or unicodedata.category(c)[0] == "C"


def encode_sample_id(sample_id: object) -> str:
    """A sample id as one token of a ``sample_ids.rank*.txt`` line: ``%``, whitespace (newlines, U+2028, ...)
    and control characters percent-encoded as UTF-8 bytes, so no id can split a line, forge one, or merge with
    its neighbour. Ordinary ids are written as they are; :func:`read_sample_ids` decodes."""
    text = str(sample_id)
    if not any(_needs_escape(c) for c in text):
        return text
    return "".join("".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass")) if _needs_escape(c) else c
                   for c in text)


def read_sample_ids(path: str | os.PathLike) -> list[list[str]]:
    """The batches of a ``sample_ids.rank*.txt`` log (one list of ids per line), ids decoded."""
    from urllib.parse import unquote

    text = Path(path).read_text(encoding="utf-8")
    return [[unquote(i, errors="surrogatepass") for i in line.split(" ")] for line in text.split("\n") if line]


IMAGE_MARKER = "<image>"
"""Marks a native image (LLaVA data) inside message text; filled from the example's ``images`` in order."""

_REQUIRED_KEYS = frozenset({"id", "messages"})
_OPTIONAL_KEYS = frozenset({"concepts", "images"})
_VISION_TOKENS = VISION_TOKENS
# Conversations whose rendering must equal the processor's template: an image between texts, a system
# message, whitespace at content edges (Qwen3.5 trims), assistant turns before and after the last user turn.
_TEMPLATE_PROBES = (
    [
        {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": " b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
    ],
    [
        {"role": "system", "content": [{"type": "text", "text": " Be brief. "}]},
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": " x\n"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "r "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "\ny"}]},
    ],
)
@dataclass
class _ImageRef:
    """An image to place in the sequence: a store image (concept) or a native image (path / PIL)."""

    key: str | None  # cache key; None for uncacheable in-memory images
    load: Any  # () -> PIL.Image
    concept: Concept | None = None
    what: str = ""


class _SampleRefused(ValueError):
    """A sample :meth:`TokenSwapCollator._plan` refused (already counted and warned); the batch goes on without it."""


@dataclass
class _Assembled:
    """A batch as :meth:`TokenSwapCollator._assemble` leaves it for encoding: per kept sample, its template text, its
    learnable character ranges, its processed images in order, and its index in the batch."""

    texts: list[str]
    learn_ranges: list[list[tuple[int, int]]]
    images: list[list[tuple[torch.Tensor, tuple[int, int, int]]]]
    keep: list[int]
    placeholder: bool = False  # every sample was refused: one row without targets stands in


def _raise(error: Exception):
    raise error


@dataclass
class TokenSwapCollator:
    """Batches conversations for Qwen-VL models, swapping concept spans for images.

    Supported: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and their MoE variants (:data:`tokenswap.families.FAMILIES`),
    each rendered with its own released chat template; another processor raises ``UnsupportedFamilyError``.

    Input examples are dicts with keys:

    - ``id`` (str | int): stable sample id; every swap decision hashes it.
    - ``messages``: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
    - ``concepts`` (optional): ``[{"message", "start", "end", "key"}]`` character spans.
    - ``images`` (optional): native images (paths relative to ``image_root``, or PIL images)
      for the ``<image>`` markers in the message text, in order (LLaVA-style data).

    Output (``arm`` ``"text"`` or ``"tokenswap"``; ``"paired"`` returns ``{"text": ..., "tokenswap": ...}``
    built from the same examples):

    - ``input_ids``, ``attention_mask``, ``labels``, ``mm_token_type_ids``: ``(B, T)`` int64,
      right-padded (left-padded when ``processor.tokenizer.padding_side == "left"``, as the
      processor pads; packed rows ignore it). Labels are ``-100`` except assistant tokens and their ``<|im_end|>``
      (``learn="assistant"``) or every non-image token (``learn="all"``, continued pre-training).
      An assistant token is a token with at least one character of the assistant turn's text: a
      token straddling the ``<|im_start|>assistant\n`` header and the answer (with Qwen2's vocabulary,
      an answer starting with "\n" merges with the header's "\n" into one "\n\n" token) is learned.
      For Qwen3.5 the assistant text includes the ``<think>\n\n</think>\n\n`` block its template writes.
    - ``pixel_values``: ``(N_patches, C·T·P·P)`` float32 and ``image_grid_thw``: ``(N_img, 3)``
      int64, present whenever the batch has an image (always, with ``dummy_image``).

    Rules: a concept whose store has no image, or whose image does not decode, stays text
    (counted in :attr:`stats`, warned once). Spans that overlap, fall outside their message or
    point at a missing message raise ``ValueError`` naming the sample. Sequences longer than
    ``max_length`` are cut at the token budget, never inside an image block: an image that
    does not fit is dropped whole with everything after it (counted). With ``dummy_image`` a
    batch without images gets one tiny fully-masked image (attention 0, labels -100) so every
    ZeRO-3 rank runs the vision tower.

    Hostile data never fails a batch for one sample (``on_bad_image`` / ``on_bad_sample`` =
    ``"error"`` make it raise instead). Images go through :func:`tokenswap.images.load_image`:
    decompression bombs, aspect ratios the processor refuses, truncated or non-image files are
    refused per image, and any processor failure on one image is caught for that image. Each
    distinct image is decoded once per batch however many spans show it. Native image paths must
    stay inside ``image_root`` (``../`` or absolute paths are refused as bad images). A swapped
    concept whose span overlaps an ``<image>`` marker stays text (``concepts_text_overlap_image_marker``).
    A sample is refused (skipped and counted, see ``on_bad_sample``) when:

    - its text contains a special token of the tokenizer (``<|im_start|>``, ``<|im_end|>``,
      ``<|endoftext|>``, the vision tokens, ...): the official path would turn them into real turn
      markers or image slots, and rewriting the text would train on text the data does not hold
      (``samples_skipped_special_token``);
    - ``learn="assistant"`` and it has no assistant turn, so it has nothing to learn
      (``samples_skipped_no_assistant_turn``);
    - it has ``images`` and their count differs from its ``<image>`` markers
      (``samples_skipped_image_marker_mismatch``). Without ``images``, ``<image>`` is plain text
      (HTML, markdown; counted as ``image_markers_as_text``);
    - it exceeds ``max_chars_per_sample`` or ``max_images_per_sample`` native images
      (``samples_skipped_too_long``, ``samples_skipped_too_many_images``).

    A batch whose every sample is refused becomes one row with no targets (a placeholder that adds
    nothing to the loss; counted as ``batches_all_refused``) instead of an exception. Any batch without a target
    token is counted as ``batches_without_targets`` (the recipes stop a run made of such steps: ``EmptyStepCallback``).

    Args:
        processor: the model's processor (``AutoProcessor.from_pretrained``).
        store: the image store concept keys are looked up in (``None``: nothing is swapped).
        policy: which concepts are swapped and which image is used.
        arm: ``"text"``, ``"tokenswap"`` or ``"paired"``.
        max_length: token budget per sample (``None``: unlimited).
        learn: which tokens carry loss.
        dummy_image: add a masked dummy image to image-less batches (needed under ZeRO-3).
        image_root: folder native image paths are resolved against; a path that leaves it (``../``,
            absolute) is refused as a bad image. ``None``: paths are used as written.
        cache_bytes: bound of the processed-pixel cache. Entries it evicts, and the cache of a collator
            that is dropped, are kept (up to 256 MiB per process) as storage for new entries of the same
            size, so a miss does not pay first-touch page faults on fresh memory.
        system_prompt: system message inserted when a conversation has none; ``None``: the family's
            default (Qwen2-VL / Qwen2.5-VL "You are a helpful assistant.", none for Qwen3-VL / Qwen3.5),
            which is what the released templates do. Set it only for a processor whose template was
            edited to insert another one; the template check at construction compares the two.
        epoch: current epoch, for policies with ``resample_each_epoch`` (see ``EpochCallback``).
        log_ids_to: append the sample ids of every batch to this file, one line per batch
            (how paired runs prove they saw the same samples in the same order). The lines of the last
            call are also in :attr:`last_ids` (what :class:`~tokenswap.training.ResumableCollator` logs).
        prepared: folder written by :func:`tokenswap.store.prepare.prepare_store` for this
            processor: store images are read there at the target size (no decode, no resize) on a
            cache miss; pixels are identical.
        pack_budget: pack the batch's samples, greedily in order, into rows of at most this many tokens
            (:mod:`tokenswap.packing`); ``None`` right-pads one sample per row. A packed batch has
            ``position_ids (4, R, T)`` (text row + per-sample mRoPE rows) and no ``attention_mask``;
            samples are also cut to this budget (image-safe, counted). ``log_ids_to`` then gets one
            line per packed row.
        pixel_dtype: dtype of the emitted ``pixel_values`` and of the pixel cache; set it to the
            model's dtype (the vision tower casts to it anyway, so a bfloat16 model computes the
            same; a float32 model given bfloat16 pixels does not).
        on_bad_image: what a native image that cannot be used does to its sample: ``"skip"`` drops
            the sample (counted as ``samples_dropped_bad_native_image``, warned once), ``"error"``
            raises :class:`~tokenswap.images.BadImageError` naming the image and the sample. Store
            images of swapped concepts that cannot be used always stay text (counted as
            ``concepts_text_corrupt_image``, or ``concepts_text_hash_mismatch`` for bytes that no longer match
            their content hash: a shard rewritten in place).
        on_bad_sample: what a sample the collator refuses (see "Hostile data") does: ``"skip"``
            (counted as ``samples_skipped_<reason>``, warned once per reason) or ``"error"`` (raises
            ``ValueError`` naming the sample).
        max_images_per_sample: at most this many images in one sample (``None``: no bound). More
            native images refuse the sample; swapped concepts beyond the bound stay text (counted as
            ``concepts_text_image_limit``).
        max_chars_per_sample: refuse a sample whose messages hold more characters (``None``: no bound).
        max_image_pixels: refuse an image with more pixels, checked from its header before decoding
            (:func:`tokenswap.images.load_image`).

    Example:
        >>> from tokenswap.collator import TokenSwapCollator  # doctest: +SKIP
        >>> collator = TokenSwapCollator(processor, store, SwapPolicy(swap_prob=1.0))  # doctest: +SKIP
        >>> batch = collator([{"id": "s0", "messages": [{"role": "user", "content": "Draw a cat"},
        ...     {"role": "assistant", "content": "Done."}],
        ...     "concepts": [{"message": 0, "start": 7, "end": 10, "key": "cat"}]}])  # doctest: +SKIP
        >>> batch["image_grid_thw"].shape  # doctest: +SKIP
        torch.Size([1, 3])
    """

    processor: Any
    store: ImageStore | None = None
    policy: SwapPolicy = field(default_factory=SwapPolicy)
    arm: Literal["text", "tokenswap", "paired"] = "tokenswap"
    max_length: int | None = 4096
    learn: Literal["assistant", "all"] = "assistant"
    dummy_image: bool = True
    image_root: str | None = None
    cache_bytes: int = 1 << 30
    system_prompt: str | None = None
    epoch: int = 0
    log_ids_to: str | None = None
    prepared: str | None = None
    pack_budget: int | None = None
    pixel_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    on_bad_image: Literal["skip", "error"] = "skip"
    on_bad_sample: Literal["skip", "error"] = "skip"
    max_images_per_sample: int | None = 256
    max_chars_per_sample: int | None = 1_000_000
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    stats: Counter = field(default_factory=Counter, init=False, repr=False)
    """Counts over every sample this collator collated: a batch the DataLoader prefetched but the Trainer never
    trained (the one after ``max_steps``) is counted too. For the trained batches only, wrap the collator in
    :class:`tokenswap.training.checkpoint.ResumableCollator` as the recipes do (recipes/post_train.py) and read its
    ``stats``."""
    last_ids: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.arm not in ("text", "tokenswap", "paired"):
            raise ValueError(f"arm must be 'text', 'tokenswap' or 'paired', got {self.arm!r}")
        if self.learn not in ("assistant", "all"):
            raise ValueError(f"learn must be 'assistant' or 'all', got {self.learn!r}")
        if self.max_length is not None and self.max_length < 16:
            raise ValueError(f"max_length must be >= 16 or None, got {self.max_length}")
        # First: UnsupportedFamilyError (a ValueError) names the supported families.
        self.family: Family = family_of(self.processor)
        tok = self.processor.tokenizer
        self._tok = tok
        self._encoder = TemplateEncoder(tok)
        self._ids = {t: tok.convert_tokens_to_ids(t) for t in _VISION_TOKENS}
        self._image_pad = self._ids["<|image_pad|>"]
        self._vision_start = self._ids["<|vision_start|>"]
        self._vision_end = self._ids["<|vision_end|>"]
        if tok.pad_token_id is None:
            raise ValueError("the processor's tokenizer has no pad token; set tokenizer.pad_token first")
        self._pad_id = tok.pad_token_id
        self._merge = self.processor.image_processor.merge_size
        self._cache = PixelCache(self.cache_bytes, PIXEL_DTYPES[self.pixel_dtype])
        self._warned: set[str] = set()
        for name in ("on_bad_image", "on_bad_sample"):
            if getattr(self, name) not in ("skip", "error"):
                raise ValueError(f"{name} must be 'skip' or 'error', got {getattr(self, name)!r}")
        for name in ("max_images_per_sample", "max_chars_per_sample"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None (no bound), got {getattr(self, name)}")
        if self.max_image_pixels < 1:
            raise ValueError(f"max_image_pixels must be >= 1, got {self.max_image_pixels}")
        # Typed in message text, any of these would become a real marker (turn, image slot, end of text).
        self._reserved = tuple(dict.fromkeys([*tok.all_special_tokens, *_VISION_TOKENS]))
        self._check_template()
        self._setup_output()

    # ------------------------------------------------------------------ template
    def _render(self, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
        """Conversation -> template string (one pad per image) and learnable char ranges."""
        return render_conversation(self.family, messages, self._system)

    def _check_template(self) -> None:
        self._system = self.system_prompt if self.system_prompt is not None else self.family.default_system_prompt
        if self.processor.chat_template is None:
            # Base checkpoints (e.g. Qwen/Qwen2-VL-7B) may ship no template; post-training then
            # teaches the Instruct one, which is what this collator renders.
            warnings.warn(
                f"the processor has no chat_template; using the {self.family.name} Instruct template", stacklevel=3
            )
            self.processor.chat_template = self.family.chat_template
        dropped = [r for r in self.policy.roles if r not in self.family.image_roles]
        if dropped:
            raise ValueError(
                f"policy.roles {list(self.policy.roles)} includes {dropped}, but the {self.family.name} chat template "
                f"renders images only in {' and '.join(self.family.image_roles)} messages; drop {dropped} from "
                "SwapPolicy.roles"
            )
        for probe in _TEMPLATE_PROBES:
            theirs = self.processor.apply_chat_template(probe, tokenize=False)
            ours, _ = self._render(probe)
            if theirs != ours:
                raise ValueError(
                    f"the processor's chat template does not match the {self.family.name} template this collator "
                    f"renders:\n  processor: {theirs!r}\n  collator:  {ours!r}\n"
                    "TokenSwapCollator reproduces the released Instruct templates of Qwen2-VL, Qwen2.5-VL, Qwen3-VL "
                    "and Qwen3.5 (system_prompt= covers an edited default system message); for another template "
                    "use the processor directly"
                )

    def _skip_unrenderable(self, sid: object, error: ValueError) -> None:
        try:
            self._refuse(sid, "template", str(error))
        except _SampleRefused:  # counted and warned in _refuse
            pass

    # ------------------------------------------------------------------ planning
    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message + " (further cases are only counted in collator.stats)", stacklevel=3)

    def _check_keys(self, ex: dict) -> None:
        if not isinstance(ex, dict):
            raise TypeError(f"TokenSwapCollator example {ex!r:.80}: expected a sample dict with 'id' and 'messages', "
                            f"got a {type(ex).__name__}")
        keys = set(ex)
        missing = _REQUIRED_KEYS - keys
        unknown = keys - _REQUIRED_KEYS - _OPTIONAL_KEYS
        if missing or unknown:
            problem = []
            if missing:
                problem.append(f"missing {sorted(missing)}")
            if unknown:
                problem.append(f"unknown {sorted(unknown)}")
            raise KeyError(
                f"TokenSwapCollator example {ex.get('id', '?')!r}: {', '.join(problem)}; keys seen: {sorted(keys)}. "
                f"Expected {sorted(_REQUIRED_KEYS)} plus optional {sorted(_OPTIONAL_KEYS)} "
                "(pass remove_unused_columns=False and map other columns away, e.g. with tokenswap.data loaders)"
            )
        sid = ex["id"]
        # The id is hashed into swap decisions and written to the sample-id log, so it must be plain text or a number.
        plain = isinstance(sid, (str, int, np.integer)) and not isinstance(sid, bool)
        if not plain or (isinstance(sid, str) and text_problem(sid)):
            raise ValueError(f"TokenSwapCollator example with id {sid!r:.80}: the id must be a string or an integer"
                             + (f" ({text_problem(sid)})" if isinstance(sid, str) else ""))

    def _native_ref(self, image: Any, sample_id: object) -> _ImageRef:
        what = f"native image of sample {sample_id!r}"
        px = self.max_image_pixels
        if isinstance(image, Image.Image):
            return _ImageRef(key=None, load=lambda: load_image(image, what=f"in-memory {what}", max_pixels=px),
                             what=f"in-memory {what}")
        if isinstance(image, dict) and ("bytes" in image or "path" in image):  # datasets.Image(decode=False)
            if image.get("bytes"):
                data = image["bytes"]
                # Keyed by content: repeats of one picture in a batch or across batches decode once.
                return _ImageRef(key="bytes:" + hashlib.sha1(data).hexdigest(), what=f"bytes of {what}",
                                 load=lambda: load_image(data, what=f"bytes of {what}", max_pixels=px))
            image = image["path"]
        if not isinstance(image, (str, os.PathLike)):
            problem = BadImageError(f"{what}: expected a path, a PIL image or {{'bytes'|'path'}}, got {type(image).__name__}")
            return _ImageRef(key=None, load=lambda: _raise(problem), what=what)
        path = os.fspath(image)
        if self.image_root is not None:
            # Lexical, not realpath: data must not climb out of image_root, but a symlink the
            # operator placed inside it (e.g. image_root/coco -> /mnt/coco) is theirs to use.
            joined = os.path.normpath(os.path.join(self.image_root, path))
            root = os.path.normpath(self.image_root)
            if os.path.isabs(path) or os.path.commonpath([root, joined]) != root:
                problem = BadImageError(
                    f"{what}: path {path!r} is not inside image_root {self.image_root!r}; native image paths must "
                    "be relative to image_root without '..' (refused, nothing read)"
                )
                return _ImageRef(key=None, load=lambda: _raise(problem), what=path)
            path = joined
        return _ImageRef(key=f"path:{path}", load=lambda: load_image(path, what=path, max_pixels=px), what=path)

    def _refuse(self, sid: object, reason: str, message: str) -> None:
        """Skip (count, warn once) or raise for a sample that cannot be used, per ``on_bad_sample``."""
        if self.on_bad_sample == "error":
            raise ValueError(f"sample {sid!r}: {message} (on_bad_sample='error')")
        self.stats[f"samples_skipped_{reason}"] += 1
        self._warn_once(f"refused:{reason}", f"sample {sid!r} skipped: {message}")
        raise _SampleRefused(f"sample {sid!r}: {message}")

    def _plan(
        self, ex: dict, arm: str, for_training: bool = True
    ) -> tuple[list[dict], list[list[tuple[int, int, _ImageRef]]]]:
        """Decide the swaps of one example: (messages with image slots, per-message image refs).

        ``for_training=False`` (:meth:`interleaved_messages`) accepts a conversation without an
        assistant turn: an evaluation prompt has none.

        Raises:
            _SampleRefused: the sample is skipped (counted and warned here).
            ValueError, KeyError: malformed examples (missing keys, bad spans): the data pipeline is
                wrong, not one sample, so these always raise.
        """
        self._check_keys(ex)
        sid = ex["id"]
        messages = ex["messages"]
        texts = sample_texts(messages, sid)
        concepts = concepts_from_sample(ex.get("concepts"), texts, sid)
        roles = [m["role"] for m in messages]
        self.stats["samples"] += 1
        native = ex.get("images") or []
        if not isinstance(native, (list, tuple)):
            raise ValueError(f"sample {sid!r}: 'images' must be a list (one entry per {IMAGE_MARKER} marker), got "
                             f"{type(native).__name__}")
        native = list(native)

        n_chars = sum(len(t) for t in texts)
        if self.max_chars_per_sample is not None and n_chars > self.max_chars_per_sample:
            self._refuse(sid, "too_long", f"{n_chars:,} characters > max_chars_per_sample={self.max_chars_per_sample:,}")
        for i, text in enumerate(texts):
            if "<" not in text:  # every special token starts with "<"; skips the scans for most messages
                continue
            for t in self._reserved:
                if t in text:
                    self._refuse(sid, "special_token", f"message {i} contains the special token {t} as text (it "
                                 f"would become a real marker); use {IMAGE_MARKER!r} for native images")
        if for_training and self.learn == "assistant" and "assistant" not in roles:
            self._refuse(sid, "no_assistant_turn", "no assistant turn, so nothing to learn with learn='assistant'")
        n_markers = sum(t.count(IMAGE_MARKER) for t in texts) if native else 0
        if not native:
            # Text-only data (HTML, markdown) may hold a literal "<image>"; there is nothing to put there.
            self.stats["image_markers_as_text"] += sum(t.count(IMAGE_MARKER) for t in texts)
        elif n_markers != len(native):
            self._refuse(sid, "image_marker_mismatch", f"{n_markers} {IMAGE_MARKER} markers but {len(native)} "
                         "entries in 'images'; they must match one to one")
        if self.max_images_per_sample is not None and len(native) > self.max_images_per_sample:
            self._refuse(sid, "too_many_images", f"{len(native)} native images > max_images_per_sample="
                         f"{self.max_images_per_sample}")
        self.stats["concepts"] += len(concepts)

        swap = [False] * len(concepts)
        if arm == "tokenswap" and concepts and self.store is not None:
            swap = self.policy.decide(sid, concepts, roles, self.epoch)
        self.stats["concepts_text_by_policy"] += len(concepts) - sum(swap)

        # Per message: sorted (start, end, ref) image slots from native markers and swapped concepts.
        slots: list[list[tuple[int, int, _ImageRef]]] = [[] for _ in messages]
        it = iter(native)
        for i, text in enumerate(texts if native else ()):
            start = text.find(IMAGE_MARKER)
            while start >= 0:
                slots[i].append((start, start + len(IMAGE_MARKER), self._native_ref(next(it), sid)))
                start = text.find(IMAGE_MARKER, start + len(IMAGE_MARKER))
        room = None if self.max_images_per_sample is None else self.max_images_per_sample - len(native)
        for k, (c, s) in enumerate(zip(concepts, swap)):
            if not s:
                continue
            if room is not None and room <= 0:
                self.stats["concepts_text_image_limit"] += 1
                continue
            if any(a < c.end and c.start < b for a, b, _ in slots[c.message]):
                # Only native markers are in slots yet (concepts never overlap each other): a concept
                # such as "image" found inside "<image>" by an extractor stays text; the picture stays.
                self.stats["concepts_text_overlap_image_marker"] += 1
                continue
            candidates = self.store.get(c.key)
            if not candidates:
                self.stats["concepts_text_missing_image"] += 1
                self._warn_once("missing", f"concept {c.key!r} (sample {sid!r}) has no image in the store; kept as text")
                continue
            im = candidates[self.policy.pick(sid, k, len(candidates), self.epoch)]
            slots[c.message].append((c.start, c.end, _ImageRef(key=im.image_id, load=im.load, concept=c, what=c.key)))
            if room is not None:
                room -= 1
        for s in slots:
            s.sort(key=lambda x: x[0])
        return messages, slots

    # ------------------------------------------------------------------ pixels
    def _pixels(self, refs: list[_ImageRef]) -> dict[int, tuple[torch.Tensor, tuple[int, int, int]] | Exception]:
        """Processed pixels for each ref (by position); a :class:`BadImageError` where the image cannot be used.

        Refs with one key share one result: an image shown by 50,000 spans of a batch is decoded and
        processed once, and only one decoded image is alive at a time.
        """
        out: dict[int, Any] = {}
        first: dict[str, int] = {}
        for i, ref in enumerate(refs):
            if ref.key is not None:
                if ref.key in first:
                    out[i] = out[first[ref.key]]
                    self._cache.hits += 1  # served without work, like a hit: cache_info stays comparable
                    continue
                first[ref.key] = i
            hit = self._cache.get(ref.key) if ref.key is not None else None
            if hit is not None:
                out[i] = hit
                continue
            out[i] = self._process(ref)
            if ref.key is not None and not isinstance(out[i], Exception):
                self._cache.put(ref.key, *out[i])
        return out

    def _process(self, ref: _ImageRef) -> tuple[torch.Tensor, tuple[int, int, int]] | BadImageError:
        ip = self.processor.image_processor
        if self.prepared is not None and ref.concept is not None:
            try:
                resized = load_prepared(Path(self.prepared), ref.key, ip)
                if resized is not None:
                    return prepared_pixels(ip, resized, self._cache.buffer(prepared_shape(ip, resized)))
            except Exception as e:  # noqa: BLE001 - the prepared copy is a cache; the store image is the truth
                self.stats["prepared_fallback"] += 1
                reason = str(e) if isinstance(e, PreparedImageError) else f"{type(e).__name__}: {e}"
                self._warn_once("prepared", f"prepared copy of {ref.what!r} not used ({reason}); decoded the store image")
        self.stats["image_decodes"] += 1
        try:
            image = ref.load()
        except BadImageError as e:  # CorruptImageError of the store is one too
            return e
        except (OSError, ValueError) as e:
            return BadImageError(f"{ref.what}: {e}")
        try:
            # One processor call per image, not one for all misses: the batched call stacks, groups
            # and concatenates (a full extra copy of every miss, about 2x slower on CPU), and its
            # slices would be views that keep the whole batch tensor alive after LRU eviction.
            # The pixels are identical either way (checked in tests/tokenswap/test_collator.py).
            proc = ip(images=[image], return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - one image the processor refuses must not stop the batch
            return BadImageError(f"{ref.what}: the image processor failed on it ({type(e).__name__}: {e})")
        return proc["pixel_values"], tuple(proc["image_grid_thw"][0].tolist())

    # ------------------------------------------------------------------ collate
    def __call__(self, examples: list[dict]) -> dict[str, Any]:
        if not examples:
            raise ValueError("TokenSwapCollator got an empty batch")
        self.last_ids = []
        if self.arm == "paired":
            return {"text": self._collate(examples, "text"), "tokenswap": self._collate(examples, "tokenswap")}
        return self._collate(examples, self.arm)

    def _log_ids(self, lines: list[str]) -> None:
        self.last_ids.extend(lines)
        if self.log_ids_to is not None:
            with open(self.log_ids_to, "a") as f:
                f.write("".join(line + "\n" for line in lines))

    def _collate(self, examples: list[dict], arm: str) -> dict[str, torch.Tensor]:
        batch = self._assemble(examples, arm)
        rows_ids, rows_labels, rows_images = self._encode(batch, examples)
        if not any((labels != -100).any() for labels in rows_labels):
            # Nothing to learn in this batch (refused, or cut before any answer): counted here, and a run made of
            # such steps is stopped by tokenswap.training.EmptyStepCallback.
            self.stats["batches_without_targets"] += 1

        batch_images = [im for imgs in rows_images for im in imgs]
        dummy = None
        if not batch_images and self.dummy_image:
            dummy = self._dummy()
            self.stats["dummy_images"] += 1
        self.stats["images"] += len(batch_images)
        if self.pack_budget is not None:
            return self._pack(rows_ids, rows_labels, rows_images, dummy, [examples[b]["id"] for b in batch.keep])
        return self._pad(rows_ids, rows_labels, batch_images, dummy)

    def _assemble(self, examples: list[dict], arm: str) -> _Assembled:
        """Each usable sample of the batch as template text, learnable ranges and processed images (refusals
        counted); a batch whose every sample was refused becomes one placeholder row."""
        plans: list[tuple | None] = []
        for ex in examples:
            try:
                plans.append(self._plan(ex, arm))
            except _SampleRefused:  # counted and warned in _plan
                plans.append(None)
        if self.pack_budget is None:  # packed: one line per pack, in _pack
            self._log_ids([" ".join(encode_sample_id(ex["id"]) for ex in examples)])
        flat = [ref for plan in plans if plan is not None for s in plan[1] for (_, _, ref) in s]
        pixels = self._pixels(flat)
        results = iter([pixels[i] for i in range(len(flat))])  # in the order of flat, which _interleave follows

        out = _Assembled([], [], [], [])
        for b, plan in enumerate(plans):
            if plan is None:
                continue
            interleaved = self._interleave(examples[b]["id"], *plan, results)
            if interleaved is None:
                continue
            rendered, images = interleaved
            try:
                text, learn = self._render(rendered)
            except ValueError as e:  # the family's template rejects it or would drop its images
                self._skip_unrenderable(examples[b]["id"], e)
                continue
            out.texts.append(text)
            out.learn_ranges.append(learn)
            out.images.append(images)
            out.keep.append(b)
        if not out.texts:
            # Every sample was refused. Raising would stop a multi-day run for a few bad rows (for one,
            # with a batch of 1); a row without targets adds nothing to the loss, which the Trainer
            # divides by the targets of the whole step.
            self.stats["batches_all_refused"] += 1
            self._warn_once("all_refused", "every sample of a batch was refused; it became one row without targets")
            text, _ = self._render([{"role": "user", "content": []}])
            out = _Assembled([text], [[]], [[]], [0], placeholder=True)
        return out

    def _interleave(self, sid, messages: list[dict], slots: list[list[tuple]], results: Iterator
                    ) -> tuple[list[dict], list[tuple[torch.Tensor, tuple[int, int, int]]]] | None:
        """One sample's messages with an image part in place of each span whose image could be used (the next
        ``results``, one per slot), and those images; None when a native image is unusable (sample dropped)."""
        rendered, images, dropped = [], [], False
        for m, s in zip(messages, slots):
            parts, pos = [], 0
            for start, end, ref in s:
                got = next(results)  # consumed for every slot, also of a dropped sample: the next sample's follow
                if isinstance(got, Exception):
                    if ref.concept is None:  # a native image is part of the sample: cannot become text
                        if self.on_bad_image == "error":
                            raise BadImageError(f"sample {sid!r}: {got}") from got
                        if not dropped:
                            self.stats["samples_dropped_bad_native_image"] += 1
                        self._warn_once("native", f"sample {sid!r} skipped: {got}")
                        dropped = True
                        continue
                    if isinstance(got, ImageMismatchError):  # the shard changed on disk, not a bad picture
                        self.stats["concepts_text_hash_mismatch"] += 1
                        self._warn_once("mismatch", str(got) + "; kept as text")
                    else:
                        self.stats["concepts_text_corrupt_image"] += 1
                        self._warn_once("corrupt", str(got) + "; kept as text")
                    continue
                if start > pos:
                    parts.append({"type": "text", "text": m["content"][pos:start]})
                parts.append({"type": "image"})
                images.append(got)
                if ref.concept is not None:
                    self.stats["concepts_swapped"] += 1
                pos = end
            if pos < len(m["content"]):
                parts.append({"type": "text", "text": m["content"][pos:]})
            rendered.append({"role": m["role"], "content": parts})
        return None if dropped else (rendered, images)

    def _encode(self, batch: _Assembled, examples: list[dict]) -> tuple[list, list, list]:
        """Token ids, labels and images of each row: one ``<|image_pad|>`` widened to each image's visual tokens,
        vision tokens never learned, each row cut to the per-sample budget."""
        rows_ids, rows_labels, rows_images = [], [], []
        # A token is learned if any of its characters is: one that straddles the header and the answer
        # (Qwen2's "\n\n" when the answer starts with "\n") carries answer text, so it is a target, as in
        # transformers' return_assistant_tokens_mask.
        encoded = self._encoder(batch.texts, batch.learn_ranges if self.learn == "assistant" else None)
        for r, (ids, learnable) in enumerate(encoded):
            images = batch.images[r]
            counts = np.ones(len(ids), dtype=np.int64)
            pad_pos = np.flatnonzero(ids == self._image_pad)
            counts[pad_pos] = [t * h * w // self._merge**2 for _, (t, h, w) in images]
            ids = np.repeat(ids, counts)
            labels = np.where(np.repeat(learnable, counts), ids, -100)
            labels[(ids == self._image_pad) | (ids == self._vision_start) | (ids == self._vision_end)] = -100
            ids, labels, images = self._truncate(ids, labels, images, examples[batch.keep[r]]["id"])
            rows_ids.append(ids)
            rows_labels.append(labels)
            rows_images.append(images)
        if batch.placeholder:  # learn="all" would otherwise learn the placeholder's template text
            rows_labels[0][:] = -100
        return rows_ids, rows_labels, rows_images

    def _truncate(self, ids, labels, images, sid):
        limit = self._cut_at
        if limit is None or len(ids) <= limit:
            return ids, labels, images
        cut = limit
        starts = np.flatnonzero(ids[:cut] == self._vision_start)
        ends = np.flatnonzero(ids[:cut] == self._vision_end)
        if len(starts) > len(ends):  # the budget ends inside an image block: drop the whole block
            cut = int(starts[-1])
        kept = int((ids[:cut] == self._vision_start).sum())
        self.stats["samples_truncated"] += 1
        self.stats["images_dropped_truncation"] += len(images) - kept
        self.stats["tokens_truncated"] += len(ids) - cut
        if not (labels[:cut] != -100).any():
            self.stats["samples_truncated_no_targets"] += 1
        self._warn_once("truncate", f"sample {sid!r} has {len(ids)} tokens > the per-sample budget {limit} "
                        f"(max_length={self.max_length}, pack_budget={self.pack_budget}); cut at {cut}")
        return ids[:cut], labels[:cut], images[:kept]

    def _dummy(self):
        hit = self._cache.get("__dummy__")
        if hit is None:
            side = 2 * self._merge * self.processor.image_processor.patch_size
            proc = self.processor.image_processor(images=[Image.new("RGB", (side, side))], return_tensors="pt")
            hit = (proc["pixel_values"], tuple(proc["image_grid_thw"][0].tolist()))
            self._cache.put("__dummy__", *hit)
        return hit

    def _pad(self, rows_ids, rows_labels, images, dummy) -> dict[str, torch.Tensor]:
        B = len(rows_ids)
        T = max(len(r) for r in rows_ids)
        extra = 0
        if dummy is not None:
            t, h, w = dummy[1]
            extra = t * h * w // self._merge**2 + 2
        input_ids = np.full((B, T + extra), self._pad_id, dtype=np.int64)
        labels = np.full((B, T + extra), -100, dtype=np.int64)
        attention = np.zeros((B, T + extra), dtype=np.int64)
        # padding_side="left" pads on the left, as the processor itself would (ROBUST-C, issue 13).
        left = self._tok.padding_side == "left"
        for b, (ids, lab) in enumerate(zip(rows_ids, rows_labels)):
            lo = T + extra - len(ids) if left else 0
            input_ids[b, lo : lo + len(ids)] = ids
            labels[b, lo : lo + len(ids)] = lab
            attention[b, lo : lo + len(ids)] = 1
        self._count_tokens(rows_ids, images, input_ids.size)
        if dummy is not None:
            # Masked keys, ignored labels: the vision tower runs (ZeRO-3 ranks stay in step) but
            # nothing attends to the dummy and it adds no loss.
            block = [self._vision_start] + [self._image_pad] * (extra - 2) + [self._vision_end]
            if left:
                input_ids[0, :extra] = block
            else:
                input_ids[0, T:] = block
            images = [dummy]
        out = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(labels),
            "mm_token_type_ids": torch.from_numpy((input_ids == self._image_pad).astype(np.int64)),
        }
        if images:
            out["pixel_values"] = self._concat_pixels([p for p, _ in images])
            out["image_grid_thw"] = torch.tensor([g for _, g in images], dtype=torch.int64)
        return out

    # ------------------------------------------------------------------ packing, pixel buffers, accounting
    def _setup_output(self) -> None:
        """Check the packing budget and family and the pixel dtype once, before any batch."""
        if self.pixel_dtype not in PIXEL_DTYPES:
            raise ValueError(f"pixel_dtype must be one of {sorted(PIXEL_DTYPES)}, got {self.pixel_dtype!r}")
        self._rope_index = None
        self._cut_at = self.max_length
        if self.pack_budget is None:
            return
        from tokenswap.families import family_of
        from tokenswap.packing import RopeIndex

        ip = self.processor.image_processor
        # The largest image the processor emits: max_pixels at patch x merge granularity, plus start/end tokens.
        block = ip.size["longest_edge"] // (ip.patch_size * self._merge) ** 2 + 2
        if self.pack_budget < block:
            raise ValueError(
                f"pack_budget={self.pack_budget} is smaller than one image block ({block} tokens for an image at the "
                f"processor's max_pixels={ip.size['longest_edge']}); raise collator.pack_budget to at least {block} "
                "(or lower model.max_pixels)"
            )
        self._rope_index = RopeIndex(family_of(self.processor).name, self._merge)
        self._cut_at = self.pack_budget if self.max_length is None else min(self.max_length, self.pack_budget)

    def _pack(self, rows_ids, rows_labels, rows_images, dummy, ids) -> dict[str, torch.Tensor]:
        from tokenswap.packing import pack_rows

        d = None
        if dummy is not None:
            t, h, w = dummy[1]
            d_ids = np.asarray([self._vision_start] + [self._image_pad] * (t * h * w // self._merge**2)
                               + [self._vision_end], dtype=np.int64)
            d = (d_ids, dummy[1])
        out, plan = pack_rows(
            rows_ids, rows_labels, [[g for _, g in imgs] for imgs in rows_images],
            budget=self.pack_budget, rope_index=self._rope_index, pad_id=self._pad_id,
            image_pad_id=self._image_pad, dummy=d,
        )
        self._log_ids([" ".join(encode_sample_id(ids[i]) for i in row) for row in plan])
        images = [im for imgs in rows_images for im in imgs]
        self._count_tokens(rows_ids, images, out["input_ids"].numel())
        self.stats["packed_rows"] += len(plan)
        if dummy is not None:
            images = [dummy]
        if images:
            out["pixel_values"] = self._concat_pixels([p for p, _ in images])
            out["image_grid_thw"] = torch.tensor([g for _, g in images], dtype=torch.int64)
        return out

    def _count_tokens(self, rows_ids, images, slots: int) -> None:
        """What the throughput callback reads: real tokens, token slots (real + padding), image patches.

        The sums of squares are the attention term: each sample attends within itself (so does each image).
        """
        self.stats["tokens"] += sum(len(r) for r in rows_ids)
        self.stats["token_sq"] += sum(len(r) ** 2 for r in rows_ids)
        self.stats["token_slots"] += slots
        self.stats["image_patches"] += sum(t * h * w for _, (t, h, w) in images)
        self.stats["patch_sq"] += sum((t * h * w) ** 2 for _, (t, h, w) in images)

    def _concat_pixels(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """``torch.cat(pieces)`` in ``pixel_dtype``, into a reused buffer when that is safe (:func:`concat_pixels`)."""
        return concat_pixels(pieces, PIXEL_DTYPES[self.pixel_dtype])

    # ------------------------------------------------------------------ helpers
    def interleaved_messages(self, ex: dict, arm: Literal["text", "tokenswap"] = "tokenswap") -> list[dict]:
        """The conversation as chat content parts with PIL images (what the processor would be given).

        Useful to feed ``processor.apply_chat_template`` + ``processor(...)`` directly, e.g. for
        evaluation or to check equivalence. Store images that cannot be used stay text, as in
        ``__call__``; a sample ``__call__`` would skip raises instead (``ValueError`` for a refused
        sample, :class:`~tokenswap.images.BadImageError` for a native image that cannot be used).
        """
        messages, slots = self._plan(ex, arm, for_training=False)
        out = []
        for m, s in zip(messages, slots):
            parts, pos = [], 0
            for start, end, ref in s:
                try:
                    image = ref.load()
                except (OSError, ValueError):  # BadImageError / CorruptImageError are ValueErrors
                    if ref.concept is None:
                        raise
                    continue
                if start > pos:
                    parts.append({"type": "text", "text": m["content"][pos:start]})
                parts.append({"type": "image", "image": image})
                pos = end
            if pos < len(m["content"]):
                parts.append({"type": "text", "text": m["content"][pos:]})
            out.append({"role": m["role"], "content": parts})
        return out

    def cache_info(self) -> dict[str, int]:
        return {"entries": len(self._cache), "bytes": self._cache.bytes, "hits": self._cache.hits,
                "misses": self._cache.misses, "recycled": self._cache.recycled}
