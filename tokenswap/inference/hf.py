"""Batched greedy generation and next-token letter scores with a local transformers model (the ``hf`` backend).

Evaluation code (gap evaluator, CrossMath, REST) shares this so every benchmark builds model
inputs the same way the model's own processor does.

Think blocks: Qwen3.5's template (4B and larger) ends the generation prompt with an open
``<think>\n``, while training (:func:`tokenswap.families.render_conversation`) puts an answer
without reasoning after ``<think>\n\n</think>\n\n``. A scorer that reads the answer's first
token (``loglik``, the naming control) closes the block first (``close_think=True``), so it reads
the distribution the answer is trained and sampled from, not the first token of a reasoning.
Generation keeps the open block (the model reasons); :func:`split_reasoning` then separates the
reasoning from the final content, as an OpenAI-compatible server returns them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "OPEN_THINK",
    "build_inputs",
    "close_open_think",
    "conversation_images",
    "generate",
    "generate_from_inputs",
    "letter_logprobs",
    "letter_token_ids",
    "split_reasoning",
]

OPEN_THINK = "<think>\n"
"""How a Qwen3.5 generation prompt that opens a think block ends."""
_CLOSED_THINK = "<think>\n\n</think>\n\n"


def close_open_think(prompt: str) -> str:
    """``prompt`` with an open think block at its end closed the way training writes an answer without reasoning.

    >>> close_open_think("<|im_start|>assistant\\n<think>\\n")
    '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'
    >>> close_open_think("<|im_start|>assistant\\n")
    '<|im_start|>assistant\\n'
    """
    return prompt + _CLOSED_THINK[len(OPEN_THINK):] if prompt.endswith(OPEN_THINK) else prompt


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str | None]:
    """``(final content, reasoning)`` of a generation: the reasoning is what precedes the last ``</think>``.

    Args:
        text: the decoded generation.
        opened: the prompt ended with an open think block (:data:`OPEN_THINK`): a generation that never
            closes it (the budget ran out while reasoning) is all reasoning and has no final content.

    >>> split_reasoning("let me see</think>\\n\\nB")
    ('B', 'let me see')
    >>> split_reasoning("B"), split_reasoning("still thinking", opened=True)
    (('B', None), ('', 'still thinking'))
    """
    head, sep, tail = text.rpartition("</think>")
    if not sep:
        return ("", text) if opened else (text, None)
    return tail.lstrip("\n"), head.removeprefix("<think>").strip("\n")


def conversation_images(conversation: Sequence[dict]) -> list:
    """Images of a conversation in the order the chat template emits their placeholders."""
    images = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, str):
            continue
        images.extend(part["image"] for part in content if part["type"] == "image")
    return images


def build_inputs(
    processor,
    conversations: Sequence[Sequence[dict]],
    add_generation_prompt: bool = True,
    close_think: bool = False,
    chat_template_kwargs: dict | None = None,
):
    """Tokenize conversations into one left-padded batch (``BatchFeature`` of tensors).

    Args:
        processor: a Qwen2-VL-family processor (``AutoProcessor.from_pretrained``).
        conversations: chat messages; content is a str or a list of ``text``/``image`` parts.
        add_generation_prompt: append the assistant header so the model answers next.
        close_think: close a think block the generation prompt opens (:func:`close_open_think`), for
            scorers that read the answer's first token.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).
    """
    texts = [
        processor.apply_chat_template(
            list(conv), tokenize=False, add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {})
        )
        for conv in conversations
    ]
    if close_think:
        texts = [close_open_think(t) for t in texts]
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
    chat_template_kwargs: dict | None = None,
) -> list[str]:
    """Greedy completions for each conversation (special tokens stripped).

    Args:
        model: a ``*ForConditionalGeneration`` model.
        processor: its processor.
        conversations: chat messages ending with the user turn.
        max_new_tokens: generation budget per conversation.
        batch_size: conversations per ``generate`` call.
        progress: show a tqdm bar.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).

    Returns:
        One decoded string per conversation, in input order.
    """
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    outputs: list[str] = []
    starts = range(0, len(conversations), batch_size)
    for start in tqdm(starts, desc="generate", disable=not progress):
        batch = build_inputs(processor, conversations[start : start + batch_size],
                             chat_template_kwargs=chat_template_kwargs)
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


@torch.no_grad()
def letter_logprobs(model, batch, letter_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Log-probability of each answer letter as the next token of every row of a left-padded batch.

    A letter's probability is the sum over its token ids (``"A"`` and ``" A"``: both start a reply
    the strict match accepts), taken in log space.

    Args:
        model: a ``*ForConditionalGeneration`` model.
        batch: from :func:`build_inputs` (with ``close_think=True`` for think-block templates).
        letter_ids: per letter, its token ids (:func:`letter_token_ids`).

    Returns:
        ``(rows, letters)`` float tensor on the CPU.
    """
    out = model(**batch.to(model.device), use_cache=False, logits_to_keep=1)
    logprobs = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)
    return torch.stack([torch.logsumexp(logprobs[:, list(ids)], dim=-1) for ids in letter_ids], dim=-1).cpu()


def letter_token_ids(tokenizer) -> list[list[int]]:
    """Token ids that start an answer with each letter: ``"A"`` and ``" A"`` where they are one token.

    A variant counts only if its first token decodes to the bare letter (a tokenizer that splits
    ``" A"`` into ``" "`` + ``"A"`` contributes no ``" A"`` id).

    Returns:
        Four lists of ids, for A, B, C, D.

    Raises:
        ValueError: a letter has no single-token form, or two letters share an id.
    """
    out = []
    for letter in "ABCD":
        ids = set()
        for text in (letter, " " + letter):
            toks = tokenizer.encode(text, add_special_tokens=False)
            if toks and tokenizer.decode(toks[:1]).strip() == letter:
                ids.add(toks[0])
        if not ids:
            raise ValueError(
                f"the tokenizer has no token that starts an answer with {letter!r}; loglik cannot score it"
            )
        out.append(sorted(ids))
    flat = [i for ids in out for i in ids]
    if len(flat) != len(set(flat)):
        raise ValueError(f"answer letters share token ids {out}; use the generate scorer")
    return out
