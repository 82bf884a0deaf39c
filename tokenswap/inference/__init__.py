"""Everything that asks a model: one room for the store build, the bench builder and the evaluators.

- ``types``: :class:`Reply`, :class:`LLMRequestError`, :class:`RequestStats`, the :class:`ChatModel` protocol
  (``chat``, ``request``, ``stats``: every chat model has all three, so no caller probes for them).
- ``ordered``: :func:`map_ordered`, many calls in flight with outcomes in input order.
- ``openai_client``: :class:`OpenAIChatModel`, any OpenAI-compatible endpoint with many requests in
  flight, back-pressure on 429/503, a deadline per attempt and the response cache.
- ``local``: :class:`TransformersChatModel`, a local transformers checkpoint (generating through ``hf``).
- ``cache``: :class:`ResponseCache` and :func:`cache_key`, the JSONL cache every backend shares.
- ``progress``: :class:`RequestProgress`, a progress bar showing requests/s, in flight, retries, errors.
- ``parsing``: :func:`parse_json_response`, the JSON object in a model's reply.
- ``hf`` (the one local generate path, :func:`~tokenswap.inference.hf.generate_batch`) / ``backends`` / ``runs`` / ``model_settings``: the evaluators' backends (a local checkpoint, any endpoint),
  per-item resumable records, the releases' per-model settings.

A new engine is one file here; no build stage or evaluator changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenswap.lazy import lazy_exports

# Lazy (PEP 562): a caller of one engine loads only that engine (the openai path no torch, the local one no
# HTTP client). Every name below still imports from here.
_EXPORTS = {
    "ResponseCache": "tokenswap.inference.cache",
    "cache_key": "tokenswap.inference.cache",
    "TransformersChatModel": "tokenswap.inference.local",
    "OpenAIChatModel": "tokenswap.inference.openai_client",
    "Outcome": "tokenswap.inference.ordered",
    "map_ordered": "tokenswap.inference.ordered",
    "parse_json_response": "tokenswap.inference.parsing",
    "ChatModel": "tokenswap.inference.types",
    "LLMRequestError": "tokenswap.inference.types",
    "Reply": "tokenswap.inference.types",
    "RequestStats": "tokenswap.inference.types",
}

__all__ = [
    "ChatModel",
    "LLMRequestError",
    "OpenAIChatModel",
    "Outcome",
    "Reply",
    "RequestStats",
    "ResponseCache",
    "TransformersChatModel",
    "cache_key",
    "map_ordered",
    "parse_json_response",
]

if TYPE_CHECKING:
    from tokenswap.inference.cache import ResponseCache, cache_key
    from tokenswap.inference.local import TransformersChatModel
    from tokenswap.inference.openai_client import OpenAIChatModel
    from tokenswap.inference.ordered import Outcome, map_ordered
    from tokenswap.inference.parsing import parse_json_response
    from tokenswap.inference.types import ChatModel, LLMRequestError, Reply, RequestStats


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
