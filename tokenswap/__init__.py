"""tokenswap: measure and reduce the modality gap of multimodal LLMs.

The main pieces import from the top level, lazily (``import tokenswap`` stays light: no torch or
transformers until one of them is used)::

    from tokenswap import TokenSwapCollator, SwapPolicy, ImageStore, GapEvaluator, GapEvalCallback
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenswap.lazy import lazy_exports  # imports nothing: the filters below still come first

__version__ = "0.1.0"


def _quiet_missing_optional_kernel() -> None:
    """Drop bitsandbytes' one warning that reads as a broken install and is none.

    Imported on a CPU with AVX512-BF16 (by transformers' Trainer, through peft), bitsandbytes tries the optional
    ``kernels`` package for a faster 4-bit CPU matmul and, when that package is not installed, logs "Failed to load
    CPU gemm_4bit_forward from kernels-community: No module named 'kernels'" and uses its own kernel. Only that case
    is dropped: a ``kernels`` that is installed and fails still prints. A filter on the module's logger, set here
    because every tokenswap command and recipe imports this package before bitsandbytes loads.
    """
    import logging

    def keep(record: logging.LogRecord) -> bool:
        said = record.getMessage()
        return not (said.startswith("Failed to load CPU gemm_4bit_forward") and "No module named 'kernels'" in said)

    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(keep)


_quiet_missing_optional_kernel()


def _quiet_cpu_accelerator_notice() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU" on a machine with no NVIDIA driver at all (no ``nvidia-smi``):
    there it tells the user nothing in every CPU run. Where a driver is installed and the GPU was not found, it
    still prints: there it is the news. Also transformers' mtime notice (below)."""
    import logging
    import shutil

    def keep(record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("Setting accelerator to CPU") and shutil.which("nvidia-smi") is None)

    logging.getLogger("DeepSpeed").addFilter(keep)
    # transformers sorts checkpoints by mtime and says "mtime may not be reliable" when two were saved within a
    # second (every tiny CPU run), then sorts by step number, which is what the checkpoint-N folders need anyway.
    logging.getLogger("transformers.trainer_utils").addFilter(
        lambda record: not record.getMessage().startswith("mtime may not be reliable"))


_quiet_cpu_accelerator_notice()

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
