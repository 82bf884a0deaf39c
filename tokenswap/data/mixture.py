"""Paired mixtures: the arms of a pair see the same samples in the same order.

The text and TokenSwap arms train on the identical mixture (LLaVA data + the Magpie swap
dataset) — only the collator's ``arm`` differs. The baseline arm drops the Magpie rows but keeps
the LLaVA rows in the same relative order.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from datasets import Dataset, concatenate_datasets

from tokenswap.data.schema import to_sample_features

__all__ = ["paired_mixture"]


def paired_mixture(
    arm: Literal["baseline", "text", "tokenswap"],
    base: Dataset | None,
    swap: Dataset | None,
    seed: int = 0,
) -> Dataset:
    """Concatenate, shuffle with ``seed``, and keep what ``arm`` trains on.

    Args:
        arm: ``baseline`` (``base`` only), ``text`` or ``tokenswap`` (``base`` + ``swap``).
        base: the VL post-training data (LLaVA); may be None for continued pre-training.
        swap: the Magpie swap dataset.
        seed: mixture order; the arms of a pair must share it.

    Returns:
        The mixture in its training order (train with a sequential sampler).
    """
    if arm not in ("baseline", "text", "tokenswap"):
        raise ValueError(f"arm must be baseline, text or tokenswap, got {arm!r}")
    parts = [to_sample_features(d) for d in (base, swap) if d is not None]
    if not parts:
        raise ValueError("paired_mixture needs at least one dataset")
    n_base = 0 if base is None else len(base)
    mixed = concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    order = np.random.default_rng(seed).permutation(len(mixed))
    if arm == "baseline":
        if base is None:
            raise ValueError("the baseline arm trains on the base (LLaVA) data only, but none was given")
        order = order[order < n_base]
    return mixed.select(order.tolist())
