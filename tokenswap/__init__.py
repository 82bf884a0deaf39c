"""tokenswap: measure and reduce the modality gap of multimodal LLMs.

The main pieces import from the top level, lazily (``import tokenswap`` stays light: no torch or
transformers until one of them is used)::

    from tokenswap import TokenSwapCollator, SwapPolicy, ImageStore, GapEvaluator, GapEvalCallback
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "TokenSwapCollator": "tokenswap.collator",
    "SwapPolicy": "tokenswap.swap",
    "ImageStore": "tokenswap.store.image_store",
    "GapEvaluator": "tokenswap.eval.gap",
    "GapEvalCallback": "tokenswap.eval.callback",
}

__all__ = ["GapEvalCallback", "GapEvaluator", "ImageStore", "SwapPolicy", "TokenSwapCollator", "__version__"]

if TYPE_CHECKING:
    from tokenswap.collator import TokenSwapCollator
    from tokenswap.eval.callback import GapEvalCallback
    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.store.image_store import ImageStore
    from tokenswap.swap import SwapPolicy


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'tokenswap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
