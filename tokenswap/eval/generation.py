"""Kept for old imports: batched HF generation lives in :mod:`tokenswap.inference.hf` (the one room for model calls)."""

from tokenswap.inference.hf import build_inputs, conversation_images, generate, generate_from_inputs

__all__ = ["build_inputs", "conversation_images", "generate", "generate_from_inputs"]
