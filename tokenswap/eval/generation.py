"""Batched greedy generation over chat conversations with images (the official processor path).

Evaluation code (gap evaluator, CrossMath, REST) shares this so every benchmark builds model
inputs the same way the model's own processor does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["build_inputs", "conversation_images", "generate", "generate_from_inputs"]


def conversation_images(conversation: Sequence[dict]) -> list:
    """Images of a conversation in the order the chat template emits their placeholders."""
    images = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, str):
            continue
        images.extend(part["image"] for part in content if part["type"] == "image")
    return images


def build_inputs(processor, conversations: Sequence[Sequence[dict]], add_generation_prompt: bool = True):
    """Tokenize conversations into one left-padded batch (``BatchFeature`` of tensors).

    Args:
        processor: a Qwen2-VL-family processor (``AutoProcessor.from_pretrained``).
        conversations: chat messages; content is a str or a list of ``text``/``image`` parts.
        add_generation_prompt: append the assistant header so the model answers next.
    """
    texts = [
        processor.apply_chat_template(list(conv), tokenize=False, add_generation_prompt=add_generation_prompt)
        for conv in conversations
    ]
    images = [im for conv in conversations for im in conversation_images(conv)]
    tokenizer = processor.tokenizer
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # generation continues from the last position of every row
    try:
        return processor(text=texts, images=images or None, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side


@torch.no_grad()
def generate(
    model,
    processor,
    conversations: Sequence[Sequence[dict]],
    max_new_tokens: int = 128,
    batch_size: int = 8,
    progress: bool = False,
) -> list[str]:
    """Greedy completions for each conversation (special tokens stripped).

    Args:
        model: a ``*ForConditionalGeneration`` model.
        processor: its processor.
        conversations: chat messages ending with the user turn.
        max_new_tokens: generation budget per conversation.
        batch_size: conversations per ``generate`` call.
        progress: show a tqdm bar.

    Returns:
        One decoded string per conversation, in input order.
    """
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    outputs: list[str] = []
    starts = range(0, len(conversations), batch_size)
    for start in tqdm(starts, desc="generate", disable=not progress):
        batch = build_inputs(processor, conversations[start : start + batch_size])
        outputs.extend(generate_from_inputs(model, processor, batch, max_new_tokens))
    model.train(was_training)
    return outputs


@torch.no_grad()
def generate_from_inputs(model, processor, batch, max_new_tokens: int = 128) -> list[str]:
    """Greedy completions of one pre-built left-padded batch (from :func:`build_inputs`).

    Callers that score a fixed set repeatedly build the batches once and call this per batch.

    Returns:
        One decoded string per row (special tokens stripped).
    """
    batch = batch.to(model.device)
    tokens = model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=processor.tokenizer.pad_token_id,
    )
    new = tokens[:, batch["input_ids"].shape[1] :]
    return processor.batch_decode(new, skip_special_tokens=True)
