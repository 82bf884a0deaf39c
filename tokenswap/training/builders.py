"""Builders: a config section in, a library object built from flat arguments out (store, collator, gap callback)."""

from __future__ import annotations

from typing import Literal

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import ImageStore
from tokenswap.swap import SwapPolicy
from tokenswap.training.config import CollatorConfig, GapEvalConfig


def build_image_store(root: str | None) -> ImageStore | None:
    return None if root is None else ImageStore(root)


def build_collator(
    cfg: CollatorConfig,
    processor,
    store: ImageStore | None,
    arm: str,
    learn: Literal["assistant", "all"] = "assistant",
    image_root: str | None = None,
) -> TokenSwapCollator:
    """The collator of one arm; ``baseline`` and ``text`` render everything as text."""
    return TokenSwapCollator(
        processor=processor,
        store=store,
        policy=SwapPolicy(
            swap_prob=cfg.swap_prob,
            max_images=cfg.max_images,
            seed=0 if cfg.swap_seed is None else cfg.swap_seed,  # None: a recipe that swaps nothing
            resample_each_epoch=cfg.resample_each_epoch,
        ),
        arm="tokenswap" if arm == "tokenswap" else "text",
        max_length=cfg.max_length,
        learn=learn,
        dummy_image=cfg.dummy_image,
        image_root=image_root,
        cache_bytes=int(cfg.cache_gb * (1 << 30)),
        prepared=cfg.prepared,
        on_bad_image=cfg.on_bad_image,
        on_bad_sample=cfg.on_bad_sample,
        max_images_per_sample=cfg.max_images_per_sample,
        max_chars_per_sample=cfg.max_chars_per_sample,
        max_image_pixels=cfg.max_image_pixels,
        pack_budget=cfg.pack_budget if cfg.packing else None,
        pixel_dtype=cfg.pixel_dtype,
    )


def build_gap_callback(cfg: GapEvalConfig, processor, trainer):
    """The in-loop gap evaluator for ``trainer``, or None when ``cfg.bench`` is unset.

    Register it with ``trainer.add_callback``; it logs through ``trainer.log`` (W&B included).
    """
    if cfg.bench is None:
        return None
    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.callback import GapEvalCallback
    from tokenswap.eval.gap import GapEvaluator

    pairs = load_tokenswap_bench_pairs(cfg.bench, split=cfg.split, limit=cfg.limit)
    evaluator = GapEvaluator(
        processor, pairs, scorer=cfg.scorer, batch_size=cfg.batch_size, progress=False, forms=cfg.forms,
    )
    return GapEvalCallback(trainer, evaluator, eval_steps=cfg.every_steps)
