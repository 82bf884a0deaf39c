"""What every model backend speaks: a reply, a request failure, and the chat-model protocol.

Kept free of transport and framework imports so the store build, the bench builder and the three
evaluators can all depend on it without pulling in torch or an HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tokenswap.redaction import redact

__all__ = ["ChatModel", "LLMRequestError", "Reply"]


class LLMRequestError(RuntimeError):
    """A model request that failed for good (after its retries); the message names the URL, never the API key.

    The message is redacted when the error is made (:func:`tokenswap.redaction.redact`): it quotes the server's
    answer, and a server or proxy that echoes the ``Authorization`` header (raw, JSON-escaped, URL-encoded or cut)
    would otherwise carry the key into every report, marker, record and log line the error reaches.
    """

    def __init__(self, message: object = "", *args: object):
        super().__init__(redact(str(message)), *args)


@dataclass
class Reply:
    """One assistant reply and what came with it.

    Attributes:
        text: the final answer content (for reasoning models: the content after the reasoning).
        reasoning: the server's ``reasoning_content`` (or ``reasoning``) when it returned one.
        usage: token counts as the server reported them (``prompt_tokens``, ``completion_tokens``).
        top_logprobs: the first generated token's top-k alternatives as ``(token, logprob)`` pairs,
            best first, when they were asked for and the server returned them; ``None`` otherwise.
        finish_reason: the server's ``finish_reason`` (``stop``, ``length``, ...), when given.
        cached: served from the response cache (no request was made).
    """

    text: str
    reasoning: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    top_logprobs: list[tuple[str, float]] | None = None
    finish_reason: str | None = None
    cached: bool = False


class ChatModel(Protocol):
    """Anything that answers a conversation with one assistant reply.

    Messages are OpenAI-style ``{"role", "content"}`` dicts whose content is a string or a list of
    parts ``{"type": "text", "text": str}`` / ``{"type": "image", "image": PIL.Image}``. ``chat`` must
    be safe to call from many threads at once: :func:`tokenswap.inference.ordered.map_ordered` drives
    it with many requests in flight.
    """

    def chat(self, messages: list[dict]) -> str:
        """Return the assistant's reply to ``messages``."""
        ...
