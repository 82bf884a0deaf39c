"""Packing several samples into one row without padding, and length-grouped sample orders.

Packing (``TokenSwapCollator(pack_budget=...)``): the samples of one collator batch are laid
end to end, greedily in their given order, into rows of at most ``pack_budget`` tokens. Each
sample's positions restart at 0, and the batch carries ``position_ids`` of shape ``(4, R, T)``:
row 0 is the plain text position (0, 1, 2, ... per sample) and rows 1-3 are the mRoPE
temporal/height/width positions that the family's own ``get_rope_index`` computes for the
sample alone. transformers 5.24 reads a 4-row ``position_ids`` as "packed input": with no
``attention_mask`` it derives the per-sample block-diagonal causal mask from row 0
(``masking_utils.find_packed_sequence_indices``: a new sequence wherever the text position does
not step by +1) for sdpa and eager, and the ``cu_seqlens`` of flash-attention 2 from the same
row. So a packed batch has no ``attention_mask`` and carries ``use_cache=False`` (with a cache,
transformers skips the packed-sequence detection); where rows of one batch differ in length, the
shorter ones are filled with pad tokens that form their own position run (their own "sample",
labels -100), so no real token attends to them. No label crosses a sample boundary either: the
model predicts label ``p + 1`` from token ``p`` of the same row, so the first label of every packed
segment is -100 (alone, a sample's first token is never a target), whatever the collator learns
(``learn="assistant"`` or ``"all"``).

How packing meets ``per_device_train_batch_size``: the dataloader still hands the collator B
samples; the collator packs them, in order, into as few rows as greedy-in-order allows (a new
row starts when the next sample does not fit), then evens those rows out (same count, smallest
longest row), since the rows of a batch are padded to the longest. Samples per optimizer step, and hence the learning-rate
schedule and the token-mean loss, are unchanged; only the tensor shape changes. A budget that
holds the whole batch gives one row and no padding at all; raise B (and the budget) to trade
more tokens per step for fewer steps.

Packing is a pure function of the sample order and the sample lengths, so every rank and every
resume packs the same way. The arms of a pair see the same samples in the same order, but their
pack boundaries may differ (a swapped concept changes a sample's length).

Length grouping (:func:`length_grouped_order`) is the lighter option: a seeded order in which
samples of similar length are neighbours, so right-padded batches waste little.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

__all__ = [
    "PACKABLE_FAMILIES",
    "PackingNotSupportedError",
    "RopeIndex",
    "greedy_pack",
    "group_by_length",
    "length_grouped_order",
    "pack_rows",
    "text_lengths",
]

PACKABLE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
"""Families whose packed rows are checked equal to their unpacked samples (tests/tokenswap/test_packing.py)."""

# Families whose rope index is computable but whose layers are not sample-separable in a packed row.
_NOT_PACKABLE: dict[str, str] = {
    "qwen3_5": (
        "Qwen3.5 interleaves Gated DeltaNet (linear attention) layers whose causal conv and recurrent state run "
        "across the whole row on sdpa/eager, so packed samples would see their neighbours"
    ),
}
_NOT_PACKABLE["qwen3_5_moe"] = _NOT_PACKABLE["qwen3_5"]


class PackingNotSupportedError(ValueError):
    """Packing was requested for a model family whose samples cannot be separated inside a packed row."""


def _family_error(family: str) -> PackingNotSupportedError:
    why = _NOT_PACKABLE.get(family, "tokenswap has not checked packing for it")
    return PackingNotSupportedError(
        f"collator.packing is not supported for the model family {family!r}: {why}. "
        f"Packable families: {', '.join(PACKABLE_FAMILIES)}. Set collator.packing=false (or group samples "
        "by length instead) for this model."
    )


class RopeIndex:
    """The family's own ``get_rope_index``, called without a model instance.

    The collator has a processor but no model. ``get_rope_index`` of the Qwen-VL families reads
    only ``config.vision_config.spatial_merge_size`` (plus ``tokens_per_second``, used for videos
    only) and ``self.get_vision_position_ids``; both are supplied here, so the positions are the
    ones the model would compute for the same unpacked sample (checked in tests/tokenswap/test_packing.py).

    Args:
        family: a family name in :data:`PACKABLE_FAMILIES` (see :mod:`tokenswap.families`).
        spatial_merge_size: the processor's ``image_processor.merge_size``.

    Raises:
        PackingNotSupportedError: for a family outside :data:`PACKABLE_FAMILIES`, naming it.
    """

    def __init__(self, family: str, spatial_merge_size: int):
        from tokenswap.families import family_of

        if family not in PACKABLE_FAMILIES:
            raise _family_error(family)
        fam = family_of(family)
        cls = getattr(importlib.import_module(fam.modeling_module), fam.base_model_class)
        self.family = family
        self._fn = cls.get_rope_index
        self._self = SimpleNamespace(
            # tokens_per_second only scales video frames; the collator emits still images.
            config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=spatial_merge_size,
                                                                 tokens_per_second=1)),
        )
        self._self.get_vision_position_ids = lambda *a, **k: cls.get_vision_position_ids(self._self, *a, **k)

    def __call__(self, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, image_grid_thw: torch.Tensor | None,
                 attention_mask: torch.Tensor) -> torch.Tensor:
        """mRoPE positions ``(3, S, L)`` of ``S`` right-padded sequences (pad positions are 0)."""
        positions, _ = self._fn(self._self, input_ids, mm_token_type_ids=mm_token_type_ids,
                                image_grid_thw=image_grid_thw, attention_mask=attention_mask)
        return positions


def greedy_pack(lengths: Sequence[int], budget: int, balance: bool = True) -> list[list[int]]:
    """Split sample indices, in order, into as few rows of at most ``budget`` tokens as possible.

    Greedy in order: a row closes when the next sample does not fit, which gives the fewest rows
    any in-order split can have. With ``balance`` the same number of rows is then filled as evenly
    as an in-order split allows (the smallest row capacity that still needs no more rows, found by
    bisection; greedy at a capacity is optimal for contiguous splits), because rows are padded to
    the longest one. The order of samples never changes and the result depends only on the
    lengths, so it is identical on every rank and after a resume.

    >>> greedy_pack([3, 4, 2, 5, 1], budget=7, balance=False)
    [[0, 1], [2, 3], [4]]
    >>> greedy_pack([3, 4, 2, 5, 1], budget=7)
    [[0], [1, 2], [3, 4]]
    """
    for i, n in enumerate(lengths):
        if n > budget:
            raise ValueError(f"sample {i} has {n} tokens > pack_budget={budget}; cut it first")

    def split(capacity: int) -> list[list[int]]:
        rows: list[list[int]] = []
        used = capacity + 1
        for i, n in enumerate(lengths):
            if used + n > capacity:
                rows.append([])
                used = 0
            rows[-1].append(i)
            used += n
        return rows

    rows = split(budget)
    if not balance or len(rows) < 2:
        return rows
    lo, hi = max(lengths), budget  # split(hi) has len(rows) rows; find the smallest such capacity
    while lo < hi:
        mid = (lo + hi) // 2
        if len(split(mid)) <= len(rows):
            hi = mid
        else:
            lo = mid + 1
    return split(lo)


@dataclass
class _Segment:
    """One run of tokens inside a packed row: a sample, the dummy image block, or row padding."""

    ids: np.ndarray
    labels: np.ndarray
    grids: list[tuple[int, int, int]]
    sample: int | None  # index of the sample; None for the dummy block and padding


def pack_rows(
    rows_ids: Sequence[np.ndarray],
    rows_labels: Sequence[np.ndarray],
    rows_grids: Sequence[Sequence[tuple[int, int, int]]],
    *,
    budget: int,
    rope_index: RopeIndex,
    pad_id: int,
    image_pad_id: int,
    dummy: tuple[np.ndarray, tuple[int, int, int]] | None = None,
) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """Pack per-sample token rows into ``R`` rows of at most ``budget`` tokens (+ the dummy block).

    Args:
        rows_ids: per sample, its token ids (already cut to ``budget``).
        rows_labels: per sample, its labels.
        rows_grids: per sample, the ``(t, h, w)`` of its images in order of appearance.
        budget: tokens per packed row.
        rope_index: the family's rope index.
        pad_id: the tokenizer's pad id (fills rows shorter than the longest row).
        image_pad_id: the image placeholder id (``mm_token_type_ids`` is 1 there).
        dummy: the masked dummy image block ``(ids, grid)`` to append to the last row, or None.

    Returns:
        ``({"input_ids", "labels", "mm_token_type_ids": (R, T), "position_ids": (4, R, T), "use_cache": False},
        rows)``,
        where ``rows[r]`` lists the sample indices packed into row ``r``, in order. Image order in
        the rows equals the order of ``rows_grids`` flattened, so ``image_grid_thw`` and
        ``pixel_values`` keep the unpacked order.
    """
    plan = greedy_pack([len(x) for x in rows_ids], budget)
    packed: list[list[_Segment]] = [
        [_Segment(rows_ids[i], rows_labels[i], list(rows_grids[i]), i) for i in row] for row in plan
    ]
    if dummy is not None:
        # The dummy may run a few tokens past the budget: it is tiny (one 2x2-merge image block).
        d_ids, d_grid = dummy
        packed[-1].append(_Segment(d_ids, np.full(len(d_ids), -100, dtype=np.int64), [d_grid], None))
    T = max(sum(len(s.ids) for s in row) for row in packed)
    for row in packed:
        fill = T - sum(len(s.ids) for s in row)
        if fill:
            row.append(_Segment(np.full(fill, pad_id, dtype=np.int64), np.full(fill, -100, dtype=np.int64), [], None))

    # mRoPE rows of every segment at once: right-padded (S, Lmax) through the family's own code.
    segments = [s for row in packed for s in row]
    lmax = max(len(s.ids) for s in segments)
    seg_ids = np.full((len(segments), lmax), pad_id, dtype=np.int64)
    seg_mask = np.zeros((len(segments), lmax), dtype=np.int64)
    for k, s in enumerate(segments):
        seg_ids[k, : len(s.ids)] = s.ids
        seg_mask[k, : len(s.ids)] = 1
    grids = [g for s in segments for g in s.grids]
    seg_ids_t = torch.from_numpy(seg_ids)
    mrope = rope_index(
        seg_ids_t,
        (seg_ids_t == image_pad_id).long(),
        torch.tensor(grids, dtype=torch.int64) if grids else None,
        torch.from_numpy(seg_mask),
    )

    R = len(packed)
    input_ids = np.empty((R, T), dtype=np.int64)
    labels = np.empty((R, T), dtype=np.int64)
    position_ids = torch.empty((4, R, T), dtype=torch.int64)
    k = 0
    for r, row in enumerate(packed):
        pos = 0
        for s in row:
            n = len(s.ids)
            input_ids[r, pos : pos + n] = s.ids
            labels[r, pos : pos + n] = s.labels
            # The model shifts labels by one inside the row, so a segment's first label would be predicted by
            # the previous segment's last token. Alone, a sample's first token is never a target either.
            labels[r, pos] = -100
            position_ids[0, r, pos : pos + n] = torch.arange(n)
            position_ids[1:, r, pos : pos + n] = mrope[:, k, :n]
            pos += n
            k += 1
    out = {
        "input_ids": torch.from_numpy(input_ids),
        "labels": torch.from_numpy(labels),
        "mm_token_type_ids": torch.from_numpy((input_ids == image_pad_id).astype(np.int64)),
        "position_ids": position_ids,
        # transformers 5.24 builds a KV cache whenever use_cache is on (config default, train mode
        # included) and then skips packed-sequence detection: the samples would attend to each other.
        "use_cache": False,
    }
    return out, plan


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int, megabatch: int = 50) -> list[int]:
    """A seeded order in which neighbouring samples have similar lengths (the Trainer's ``group_by_length``).

    As transformers' ``LengthGroupedSampler``: shuffle with ``seed``, cut into mega-batches of
    ``megabatch * batch_size`` samples, sort each mega-batch by length (longest first), so every
    batch of ``batch_size`` consecutive samples is nearly uniform in length while the order stays
    random at the mega-batch scale. A pure function of ``(lengths, batch_size, seed, megabatch)``:
    give both arms of a pair the same lengths (the text arm's, see
    :func:`tokenswap.packing.text_lengths`) and they see the same order.

    Args:
        lengths: one length per sample (any consistent unit).
        batch_size: samples per batch on one device x number of devices (one global step's worth per
            mega-batch slice).
        seed: the order seed; the arms of a pair share it.
        megabatch: batches per sorted window; 1 sorts within each batch only.

    Returns:
        A permutation of ``range(len(lengths))``.

    >>> length_grouped_order([5, 1, 9, 2, 8, 3], batch_size=2, seed=0, megabatch=3)
    [2, 4, 0, 5, 3, 1]
    """
    if batch_size < 1 or megabatch < 1:
        raise ValueError(f"batch_size and megabatch must be >= 1, got {batch_size}, {megabatch}")
    n = len(lengths)
    perm = np.random.default_rng(seed).permutation(n)
    lens = np.asarray(lengths)
    size = batch_size * megabatch
    order: list[int] = []
    for start in range(0, n, size):
        chunk = perm[start : start + size]
        # stable sort on -length: ties keep the seeded order.
        order.extend(chunk[np.argsort(-lens[chunk], kind="stable")].tolist())
    return order


def text_lengths(examples: Sequence[dict], tokens_per_image: int = 256) -> list[int]:
    """Approximate length of each sample as the text arm sees it: characters / 4 + native images.

    Known without the image store or the tokenizer, and identical for both arms of a pair (the
    TokenSwap arm's lengths depend on which concepts become images), so grouping by it keeps the
    arms paired.

    Args:
        examples: samples with ``messages`` and optional ``images`` (native images, present in both arms).
        tokens_per_image: tokens counted per native image.
    """
    return [
        sum(len(m["content"]) for m in ex["messages"]) // 4 + tokens_per_image * len(ex.get("images") or [])
        for ex in examples
    ]


def group_by_length(dataset, batch_size: int, seed: int, megabatch: int = 50):
    """``dataset`` reordered by :func:`length_grouped_order`: a ``datasets.Dataset`` stays one, a list stays a list.

    The lengths are :func:`text_lengths` (the text arm's), so both arms of a pair, given the same
    mixture, ``batch_size`` and ``seed``, get the same order: paired runs stay paired.

    Args:
        dataset: samples with ``messages`` (and optional ``images``), in their mixture order: a
            ``datasets.Dataset`` (post-training, pre-training) or a list of dicts (image SFT).
        batch_size: ``per_device_train_batch_size`` (the batches that are padded together).
        seed: the order seed (the recipes use ``data.seed``).
        megabatch: batches per sorted window.

    >>> [ex["id"] for ex in group_by_length([{"id": i, "messages": [{"content": "x" * 4 * n}]} for i, n in
    ...                                      enumerate([5, 1, 9, 2])], batch_size=2, seed=0, megabatch=1)]
    [2, 0, 3, 1]
    """
    if isinstance(dataset, Sequence):
        return [dataset[i] for i in length_grouped_order(text_lengths(dataset), batch_size, seed, megabatch)]
    columns = [c for c in ("messages", "images") if c in dataset.column_names]
    lengths = text_lengths(list(dataset.select_columns(columns)))
    return dataset.select(length_grouped_order(lengths, batch_size, seed, megabatch))
