"""Batched greedy generation and next-token letter scores with a local transformers model (the ``hf`` backend).

Every local generation goes through :func:`generate_batch` (the ``hf`` backend of the three evaluators, the
in-loop gap evaluator, :class:`~tokenswap.inference.TransformersChatModel`), and every evaluator builds model
inputs here (:func:`build_inputs`) the same way the model's own processor does.

Think blocks: Qwen3.5's template (4B and larger) ends the generation prompt with an open
``<think>\n``, while training (:func:`tokenswap.families.render_conversation`) puts an answer
without reasoning after ``<think>\n\n</think>\n\n``. A scorer that reads the answer's first
token (``loglik``, the naming control) closes the block first (``close_think=True``), so it reads
the distribution the answer is trained and sampled from, not the first token of a reasoning.
Generation keeps the open block (the model reasons); :func:`generate_batch` then separates the
reasoning from the final content (:func:`split_reasoning`), as an OpenAI-compatible server returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# split_reasoning lives with the other reply parsing: the openai backend needs it, and this module is torch's.
from tokenswap.inference.parsing import split_reasoning

__all__ = [
    "OPEN_THINK",
    "build_inputs",
    "close_open_think",
    "conversation_images",
    "prompt_opens_think",
    "Completion",
    "generate_batch",
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


@dataclass
class Completion:
    """One greedy completion of :func:`generate_batch`.

    Attributes:
        decoded: the generated tokens decoded, special tokens stripped (what the model wrote, reasoning included).
        text: the final content, after a think block (:func:`split_reasoning`; whitespace kept as generated).
        reasoning: the think block's content, when there was one.
        prompt_tokens: the prompt's tokens (padding excluded).
        completion_tokens: tokens generated up to and including the first stop token.
        finish_reason: ``"stop"`` (a stop token came) or ``"length"`` (the budget ran out first).
    """

    decoded: str
    text: str
    reasoning: str | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


def prompt_opens_think(processor, conversation: Sequence[dict], chat_template_kwargs: dict | None = None) -> bool:
    """Whether the generation prompt of ``conversation`` ends with an open think block (:data:`OPEN_THINK`)."""
    prompt = processor.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True,
                                           **(chat_template_kwargs or {}))
    return prompt.endswith(OPEN_THINK)


@torch.no_grad()
def generate_batch(model, tokenizer, batch, max_new_tokens: int, opened: Sequence[bool]) -> list[Completion]:
    """Greedy completions of one left-padded batch: the one place a local checkpoint generates.

    The ``hf`` evaluation backend, the in-loop gap evaluator and :class:`~tokenswap.inference.TransformersChatModel`
    all generate here, so each splits a think block off the same way, once.

    Args:
        model: a causal or ``*ForConditionalGeneration`` model; its train/eval mode is restored.
        tokenizer: its tokenizer (``processor.tokenizer`` for a processor).
        batch: the tokenized prompts (:func:`build_inputs`, or a tokenizer's ``apply_chat_template``).
        max_new_tokens: generation budget per row.
        opened: per row, whether its prompt opened a think block (:func:`prompt_opens_think`).

    Returns:
        One :class:`Completion` per row, in batch order.
    """
    batch = batch.to(model.device)
    stop = {tokenizer.pad_token_id, *_as_list(model.generation_config.eos_token_id)} - {None}
    was_training = model.training
    model.eval()
    try:
        tokens = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                pad_token_id=tokenizer.pad_token_id)
    finally:
        model.train(was_training)
    out = []
    for row, ids in enumerate(tokens[:, batch["input_ids"].shape[1]:].tolist()):
        ended = next((i for i, t in enumerate(ids) if t in stop), None)
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        text, reasoning = split_reasoning(decoded, opened[row])
        out.append(Completion(decoded=decoded, text=text, reasoning=reasoning,
                              prompt_tokens=int(batch["attention_mask"][row].sum()),
                              completion_tokens=len(ids) if ended is None else ended + 1,
                              finish_reason="length" if ended is None else "stop"))
    return out


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


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
