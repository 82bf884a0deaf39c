"""Chat models behind one small interface (a re-export of :mod:`tokenswap.inference`) and JSON parsing of replies.

Used wherever the library asks a model a question: the LLM concept extractor, the validity
judge of the store build, the bench builder's filters. Messages are OpenAI-style
``{"role", "content"}`` dicts whose content is a string or a list of parts
``{"type": "text", "text": str}`` / ``{"type": "image", "image": PIL.Image}``.

The clients live in :mod:`tokenswap.inference` (``openai_client``: the concurrent OpenAI-compatible client
on httpx; ``local``: a transformers checkpoint; ``cache``: the JSONL response cache keyed by a hash of
model name, generation settings and messages including image pixels). API keys are read from the
environment at request time and never enter the cache, logs or exceptions. This module keeps the names
importable where they always were and holds :func:`parse_json_response`.
"""

from __future__ import annotations

import itertools
import json
import re

from tokenswap.inference.cache import ResponseCache, cache_key
from tokenswap.inference.local import TransformersChatModel
from tokenswap.inference.openai_client import OpenAIChatModel, RequestStats
from tokenswap.inference.types import ChatModel, LLMRequestError, Reply

__all__ = [
    "ChatModel",
    "LLMRequestError",
    "OpenAIChatModel",
    "Reply",
    "RequestStats",
    "ResponseCache",
    "TransformersChatModel",
    "cache_key",
    "parse_json_response",
]


# ----------------------------------------------------------------------------- parsing

MAX_STARTS = 64
"""How many fenced blocks and ``{`` positions :func:`parse_json_response` tries before giving up."""

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def parse_json_response(text: str) -> dict:
    """Extract the JSON object from a model reply, tolerating code fences and prose around it.

    Tries, in order: the whole reply, each fenced block, then the first ``{...}`` that decodes.

    Raises:
        ValueError: no JSON object in the reply (also when it holds only JSON Python cannot take: nesting
            deeper than the recursion limit, integers of more than 4,300 digits); the message quotes its start.

    >>> parse_json_response('Sure! ```json\\n{"a": 1}\\n``` Hope that helps.')
    {'a': 1}
    >>> parse_json_response('The answer is {"a": [1, 2]} as requested.')
    {'a': [1, 2]}
    """
    candidates = [text.strip()] + [m.group(1).strip() for m in itertools.islice(_FENCE.finditer(text), MAX_STARTS)]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):  # not JSON, 100,000-deep nesting, a 4,300-digit integer
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    # Bounded: a reply of 100,000 "{" would otherwise be decoded from each of them, each as deep as it goes.
    for m in itertools.islice(re.finditer(r"\{", text), MAX_STARTS):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    preview = text[:200].replace("\n", " ")
    raise ValueError(f"no JSON object found in model reply: {preview!r}")
