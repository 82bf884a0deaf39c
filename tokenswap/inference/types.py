"""What every model backend speaks: a reply, a request failure, request statistics and the chat-model protocol.

Kept free of transport and framework imports so the store build, the bench builder and the three
evaluators can all depend on it without pulling in torch or an HTTP client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Protocol

from tokenswap.redaction import redact

__all__ = ["ChatModel", "LLMRequestError", "Reply", "RequestStats"]

_LARGEST = ("max_in_flight", "limit", "wall_s")


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


@dataclass
class RequestStats:
    """What a chat model did so far (for progress bars, ``report.json`` and ``requests.json``); updated from many
    threads. Every :class:`ChatModel` keeps one; :meth:`merge` is the one way several are summed.

    Attributes:
        requests: HTTP attempts made (cache hits excluded, retries included).
        replies: calls answered by the server.
        cached: calls answered from the response cache (or by sharing a request for the same question in flight).
        retries: attempts after a call's first.
        errors: calls that failed for good (raised :class:`LLMRequestError`).
        throttled: 429/503 answers (each lowers the number in flight).
        in_flight: HTTP attempts in flight now.
        max_in_flight: the most ever in flight at once.
        limit: the adaptive in-flight limit now (``concurrency`` unless 429/503 lowered it).
        prompt_tokens, completion_tokens: summed from the replies' ``usage``.
        wall_s: seconds from the first attempt's start to the last one's end.
    """

    requests: int = 0
    replies: int = 0
    cached: int = 0
    retries: int = 0
    errors: int = 0
    throttled: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    limit: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    _first: float | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict:
        """The counts as a JSON-able dict."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    @staticmethod
    def merge(counts: Iterable[RequestStats | dict]) -> dict:
        """Several models' (or ranks') counts as one: ``max_in_flight``, ``limit`` and ``wall_s`` are the largest,
        every other count (``in_flight`` included: in flight now, across them) is summed.

        >>> RequestStats.merge([{"requests": 2, "max_in_flight": 2}, {"requests": 3, "max_in_flight": 1}])
        {'requests': 5, 'max_in_flight': 2}
        """
        total: dict = {}
        for row in counts:
            for k, v in (row.as_dict() if isinstance(row, RequestStats) else row).items():
                total[k] = max(total.get(k, 0), v) if k in _LARGEST else total.get(k, 0) + v
        return total

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def _start(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._first is None:
                self._first = now
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _end(self) -> None:
        with self._lock:
            self.in_flight -= 1
            if self._first is not None:
                self.wall_s = time.monotonic() - self._first



class ChatModel(Protocol):
    """Anything that answers a conversation with one assistant reply, and counts what it asked.

    Messages are OpenAI-style ``{"role", "content"}`` dicts whose content is a string or a list of
    parts ``{"type": "text", "text": str}`` / ``{"type": "image", "image": PIL.Image}``. ``chat`` and ``request``
    must be safe to call from many threads at once: :func:`tokenswap.inference.ordered.map_ordered` drives
    them with many requests in flight. Implementations: :class:`~tokenswap.inference.OpenAIChatModel`,
    :class:`~tokenswap.inference.TransformersChatModel`, :class:`tokenswap.testing.ScriptedChatModel`.

    Attributes:
        stats: what it asked so far; callers read it directly (no model lacks one).
    """

    stats: RequestStats

    def chat(self, messages: list[dict]) -> str:
        """Return the assistant's reply text to ``messages`` (``request(messages).text``)."""
        ...

    def request(
        self,
        messages: list[dict],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_logprobs: int | None = None,
        extra_body: dict | None = None,
        use_cache: bool = True,
    ) -> Reply:
        """The assistant's :class:`Reply` to ``messages``; a backend that cannot honour an option raises
        ``ValueError`` naming it (a local model decodes greedily only)."""
        ...
