"""The OpenAI-compatible client: many requests in flight, back-pressure, and the promises of a days-long build.

One :class:`OpenAIChatModel` serves every thread of a process: the build stages and the evaluators call
:meth:`OpenAIChatModel.request` from :func:`tokenswap.inference.map_ordered`'s threads, and the client keeps
at most ``concurrency`` HTTP attempts in flight on one thread-safe httpx connection pool (its
``HTTPTransport``, which each attempt calls directly: see :meth:`OpenAIChatModel._http`). Each attempt
runs in its caller's thread with a deadline every socket operation is held to (connect, TLS, send, wait and
read each get at most the time left), so the whole attempt takes at most ``timeout`` seconds, whatever the
server drips. The synchronous client was chosen over ``httpx.AsyncClient`` on a background loop after
measuring both on loopback: ~0.5 ms of CPU per request against ~3 ms, which on a busy machine is the
difference between keeping a 32-slot server full or not.
"""

from __future__ import annotations

import base64
import email.utils
import io
import json
import math
import os
import random
import ssl
import threading
import time
from concurrent.futures import Future
from typing import Any

import httpcore
import httpx
from PIL import Image

from tokenswap.inference.cache import ResponseCache, cache_key
from tokenswap.inference.types import LLMRequestError, Reply, RequestStats
from tokenswap.redaction import base_url_problem, redact, remember_env

__all__ = ["OpenAIChatModel", "RequestStats"]  # RequestStats: re-exported from types for old imports


def _png_data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _to_openai_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    out = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            out.append({"type": "text", "text": part["text"]})
        elif kind == "image":
            out.append({"type": "image_url", "image_url": {"url": _png_data_url(part["image"])}})
        elif kind == "image_url":
            out.append(part)  # already encoded by the caller (resized, re-encoded): sent as given
        else:
            raise ValueError(f"message part type must be 'text', 'image' or 'image_url', got {kind!r}")
    return out


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None, throttled: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.throttled = throttled


def _retry_after(value: str | None, cap: float) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), capped; None if absent/bad."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), cap)


_attempt_deadline = threading.local()  # .at: the monotonic deadline of the attempt running in this thread


def _capped(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` held to the time left of this thread's attempt; raises ``error`` once none is left."""
    deadline = getattr(_attempt_deadline, "at", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the attempt's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake waits no longer than the attempt has left.

    httpx's timeouts are per socket operation: a read timeout restarts with every chunk, so a server
    sending a byte a second holds a call for ever. Capping each operation by the deadline makes the
    attempt's total bounded instead.
    """

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _capped(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _capped(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, _capped(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = super().connect_tcp(host, port, _capped(timeout, httpcore.ConnectTimeout), local_address,
                                     socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _DeadlineStream(super().connect_unix_socket(path, _capped(timeout, httpcore.ConnectTimeout),
                                                           socket_options))


def _transport(ceiling: int) -> httpx.HTTPTransport:
    """httpx's own transport over a connection pool whose sockets keep the attempt deadline.

    ``HTTPTransport`` takes no network backend, so its pool is rebuilt with the same settings and ours.
    The system's CA store (and OpenSSL's ``SSL_CERT_FILE``) verifies TLS, as ``http.client`` did,
    rather than httpx's certifi bundle: a private CA in front of a vLLM server keeps working.
    """
    context = ssl.create_default_context()
    transport = httpx.HTTPTransport(verify=context, trust_env=False)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=context,
        max_connections=ceiling,
        max_keepalive_connections=ceiling,
        # Under the keep-alive timeout of common servers (uvicorn behind vLLM/SGLang: 5 s), so an idle connection
        # is dropped here before the server closes it under a request being sent.
        keepalive_expiry=2.0,
        network_backend=_DeadlineBackend(),
    )
    return transport


class _AdaptiveLimit:
    """At most ``ceiling`` attempts in flight, halved by a 429/503 and climbing back by one per round of successes.

    A decrease counts once per round: only an attempt that started after the last decrease can lower the
    limit again, so 32 rejections of one burst halve it once, not 32 times. ``Retry-After`` pauses every
    attempt, not only the one it came with.
    """

    def __init__(self, ceiling: int, stats: RequestStats):
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self.paused_until = 0.0
        self.epoch = 0
        self.stats = stats
        stats.limit = ceiling
        self._cond = threading.Condition()

    def acquire(self) -> int:
        with self._cond:
            while True:
                wait = self.paused_until - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                elif self.in_flight < max(1, int(self.limit)):
                    self.in_flight += 1
                    return self.epoch
                else:
                    self._cond.wait()

    def release(self, epoch: int, outcome: str, retry_after: float | None = None) -> None:
        with self._cond:
            self.in_flight -= 1
            if outcome == "throttled":
                if epoch == self.epoch:
                    self.limit = max(1.0, math.floor(self.limit / 2))
                    self.epoch += 1
                if retry_after:
                    self.paused_until = max(self.paused_until, time.monotonic() + retry_after)
            elif outcome == "ok":
                # +1 per round of successes (additive increase), so a limit found by halving is probed gently.
                self.limit = min(float(self.ceiling), self.limit + 1.0 / max(1, int(self.limit)))
            self.stats.limit = int(self.limit)
            if outcome == "throttled":
                self._cond.notify_all()  # a new pause: every waiter re-reads how long to wait
            else:
                # Only as many waiters as there are free slots: waking all of them (up to one per worker thread of
                # every stream) for each answer cost more CPU than sending the request.
                free = max(1, int(self.limit)) - self.in_flight
                if free > 0:
                    self._cond.notify(free)


class OpenAIChatModel:
    """A model served behind ``POST {base_url}/chat/completions`` (OpenAI, vLLM, SGLang, Ollama, ...).

    Built on ``httpx`` (one pooled, thread-safe client) and hardened for long unattended builds:

    - **Many requests in flight.** :meth:`request` is thread-safe; with ``concurrency=32`` up to 32
      HTTP attempts run at once (drive it with :func:`tokenswap.inference.map_ordered`).
      ``concurrency=1`` is one request at a time.
    - **Back-pressure.** A 429 or 503 halves the number in flight (once per round of requests) and a
      ``Retry-After`` pauses every request to the server until it has passed; each round of successes
      (as many as the limit) adds one back, up to ``concurrency``. A rate-limited API is slowed down, not hammered.
    - **No redirects.** A 3xx answer is an error naming the target, so the ``Authorization``
      header can never travel to another host; point ``base_url`` at the final address. HTTP(S)
      proxies and ``.netrc`` from the environment are not used (``trust_env=False``): the key goes to
      ``base_url``'s host and nowhere else.
    - **A deadline per attempt**, not per socket read: connect, send, wait and read together
      take at most ``timeout`` seconds (every socket operation waits at most the time the attempt has
      left), so a server dripping one byte a second cannot hold a call.
      A call with retries is bounded by ``(max_retries + 1) * timeout`` plus the backoff sleeps
      (plus any wait for a free slot).
    - **A response size limit** (``max_response_bytes``), checked against ``Content-Length``
      and while reading.
    - **Clear, retried failures.** Connection errors, deadline overruns, cut bodies, non-UTF-8
      or non-JSON bodies and HTTP 408/409/429/5xx are retried with exponential backoff and full
      jitter, honouring ``Retry-After``; every error names the URL, never the key. Other HTTP errors
      (4xx, 3xx) and oversized replies raise at once.
    - **A reply is an answer or a failed request, decided here once** (every consumer follows it): a ``null``
      or missing ``content``, a body Python's JSON parser cannot take (100,000-deep nesting, a 4,300-digit
      integer), text that is not valid Unicode, and, when ``top_logprobs`` were asked for, logprobs that are
      not finite numbers <= 0 are invalid replies: retried like a 5xx, then :class:`LLMRequestError`, never
      cached, so no stage commits them as done and no evaluator scores them; the rerun asks again. The one
      ``null`` that is an answer: ``finish_reason: "length"`` with reasoning (a thinking model spent its whole
      budget thinking) is the empty answer ``""`` with its reasoning, as the release scores it.
    - **Only real answers are cached**: an empty reply is returned as ``""`` but not cached, so a rerun asks
      again. Concurrent calls with the same question share one request when the cache is on.
    - **No key in a reply or an error**: the reply's text and reasoning and every error message are redacted
      (:mod:`tokenswap.redaction`: the key in ``api_key_env``, JSON-escaped, URL-encoded or cut), so a server
      echoing the ``Authorization`` header, or a model repeating the key, puts it in no cache, record or log.

    The ``openai`` package was not used: its retries and timeouts are its own (per phase, no deadline for a
    whole attempt), it follows no size limit, and the build needs the key-stays-home, cache and
    back-pressure rules above anyway; ``httpx`` (which ``openai`` runs on) gives the pooled transport.

    Args:
        base_url: endpoint root, e.g. ``"https://api.openai.com/v1"`` or ``"http://localhost:8000/v1"``.
        model: model name sent in the request (also part of the cache key).
        api_key_env: environment variable holding the API key; when unset no ``Authorization``
            header is sent (local servers usually need none).
        temperature: sampling temperature (0 = greedy, so cached answers are what a rerun would get).
        max_tokens: maximum completion length.
        timeout: total seconds for one HTTP attempt (connect + send + wait + read).
        max_retries: retries after the first attempt for transient failures.
        cache_path: JSONL response cache; ``None`` disables caching.
        max_response_bytes: largest response body accepted.
        max_backoff: longest sleep between attempts, ``Retry-After`` included.
        concurrency: most HTTP attempts in flight at once (>= 1).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout: float = 60.0,
        max_retries: int = 3,
        cache_path: str | os.PathLike | None = None,
        max_response_bytes: int = 16 << 20,
        max_backoff: float = 60.0,
        concurrency: int = 32,
    ):
        self.base_url = base_url.rstrip("/")
        problem = base_url_problem(self.base_url, "base_url", api_key_env)
        if problem:
            raise ValueError(problem)
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout}")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.model = model
        self.api_key_env = api_key_env
        remember_env(api_key_env)  # every message, record and log line masks this key from now on
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_response_bytes = max_response_bytes
        self.max_backoff = max_backoff
        self.concurrency = concurrency
        self.url = f"{self.base_url}/chat/completions"
        # Parsed once: httpx parses a string URL and normalises a dict of headers again for every request.
        self._parsed_url = httpx.URL(self.url)
        self._headers: tuple[str | None, httpx.Headers] | None = None  # (API key, the request headers with it)
        self._timeouts = {"timeout": httpx.Timeout(self.timeout).as_dict()}  # connect, read, write, pool
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self.stats = RequestStats(limit=concurrency)
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._pending: dict[str, Future] = {}  # cache key -> the call asking it now
        self._pool: httpx.HTTPTransport | None = None
        self._client_pid: int | None = None
        self._limit = _AdaptiveLimit(concurrency, self.stats)

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r}, concurrency={self.concurrency})"

    @property
    def num_requests(self) -> int:
        """HTTP attempts made so far (cache hits excluded)."""
        return self.stats.requests

    # ------------------------------------------------------------------ public calls

    def chat(self, messages: list[dict]) -> str:
        """The assistant's reply text to ``messages`` (``request(messages).text``)."""
        return self.request(messages).text

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
        """Ask the server once (retrying transient failures) and return its :class:`Reply`.

        Thread-safe. ``top_logprobs=k`` asks for the first generated token's top-k alternatives
        (``Reply.top_logprobs``); ``extra_body`` is merged into the JSON payload (server-specific
        fields such as vLLM's ``chat_template_kwargs``; a ``None`` value removes that field, e.g.
        ``{"max_tokens": None, "max_completion_tokens": 512}`` for OpenAI's reasoning models).

        Raises:
            LLMRequestError: the retries are spent, or the server refused for good (a 4xx, a
                redirect, an oversized reply); the message names the URL, never the key.
        """
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        temperature = self.temperature if temperature is None else temperature
        # The settings of today's calls alone, so a cache written before these options existed still hits.
        settings: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if top_logprobs is not None:
            settings["top_logprobs"] = top_logprobs
        if extra_body:
            settings["extra_body"] = extra_body
        cache = self.cache if use_cache else None
        key = cache_key(self.model, messages, **settings) if cache is not None else ""
        if cache is not None:
            if (entry := cache.get_entry(key)) is not None:
                self.stats.add(cached=1)
                return _reply_from_entry(entry)
            with self._lock:
                entry = cache.get_entry(key)  # answered while this thread got here: no second request
                leader = entry is None and key not in self._pending
                future = self._pending.setdefault(key, Future()) if entry is None else None
            if entry is not None:
                self.stats.add(cached=1)
                return _reply_from_entry(entry)
            if not leader:  # the same question is in flight on another thread: share its answer
                reply = future.result()
                self.stats.add(cached=1)
                return Reply(**{**vars(reply), "cached": True})
        try:
            reply = self._ask(messages, max_tokens, temperature, top_logprobs, extra_body)
        except BaseException as err:
            if cache is not None:
                self._settle(key, error=err)
            raise
        if cache is not None:
            if reply.text:
                cache.put(
                    key,
                    reply.text,
                    reasoning=reply.reasoning,
                    top_logprobs=reply.top_logprobs,
                    finish_reason=reply.finish_reason,
                )
            self._settle(key, reply=reply)
        return reply

    def close(self) -> None:
        """Close the connection pool (the client opens a new one if used again) and the cache file."""
        pool, self._pool = self._pool, None
        if pool is not None and self._client_pid == os.getpid():
            pool.close()
        if self.cache is not None:
            self.cache.close()

    # ------------------------------------------------------------------ internals

    def _settle(self, key: str, reply: Reply | None = None, error: BaseException | None = None) -> None:
        with self._lock:
            future = self._pending.pop(key, None)
        if future is not None:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(reply)

    def _http(self) -> httpx.HTTPTransport:
        """The connection pool requests are sent through, as ``httpx.Client`` sends them, minus what an API call
        has no use for: redirects are answered by :meth:`_attempt` (never followed), no cookie is kept between
        calls, no proxy is read from the environment. Sent straight to the transport, a request costs 0.4 ms less
        CPU than through ``Client.stream`` (its URL, header and cookie merging per call), which is a fifth of
        what an evaluation spends per request."""
        with self._lock:
            if self._pool is None or self._client_pid != os.getpid():  # first use, or a forked child
                self._pool = _transport(self.concurrency)
                self._client_pid = os.getpid()
            return self._pool

    def _ask(
        self, messages: list[dict], max_tokens: int, temperature: float, top_logprobs: int | None, extra_body: dict | None
    ) -> Reply:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": _to_openai_content(m["content"])} for m in messages],
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if top_logprobs is not None:
            payload["logprobs"] = True
            payload["top_logprobs"] = top_logprobs
        if extra_body:
            payload.update(extra_body)
            # A None in extra_body removes a field: OpenAI's reasoning models refuse max_tokens and temperature.
            payload = {k: v for k, v in payload.items() if v is not None}
        body = json.dumps(payload).encode()
        try:
            return self._call(body, top_logprobs is not None)
        except LLMRequestError:
            self.stats.add(errors=1)
            raise

    def _request_headers(self) -> httpx.Headers:
        api_key = os.environ.get(self.api_key_env) or None  # read per request: a rotated key is picked up
        built = self._headers
        if built is None or built[0] != api_key:
            # The headers httpx.Client sent (its User-Agent and keep-alive), ours over them; Host and Content-Length
            # are added by httpx.Request.
            headers = {"Accept": "application/json", "Accept-Encoding": "identity", "Connection": "keep-alive",
                       "User-Agent": f"python-httpx/{httpx.__version__}", "Content-Type": "application/json"}
            if api_key:
                headers["Authorization"] = f"Bearer {api_key}"
            built = self._headers = (api_key, httpx.Headers(headers))
        return built[1]

    def _call(self, body: bytes, want_logprobs: bool = False) -> Reply:
        headers = self._request_headers()
        limit = self._limit
        pool = self._http()
        last_error = ""
        retry_after: float | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                # Full jitter: ranks retrying the same overloaded server spread out instead of
                # returning together.
                delay = self._rng.uniform(0.0, min(self.max_backoff, 0.5 * 2**attempt))
                time.sleep(max(delay, retry_after or 0.0))
                self.stats.add(retries=1)
            epoch = limit.acquire()
            self.stats._start()
            outcome = "error"
            _attempt_deadline.at = time.monotonic() + self.timeout
            try:
                reply = self._attempt(pool, body, headers, want_logprobs)
                outcome = "ok"
                return reply
            except _Retryable as e:
                last_error, retry_after = str(e), e.retry_after
                if e.throttled:
                    outcome = "throttled"
                    self.stats.add(throttled=1)
            finally:
                _attempt_deadline.at = None
                self.stats._end()
                limit.release(epoch, outcome, retry_after if outcome == "throttled" else None)
        raise LLMRequestError(f"{self.url} failed after {self.max_retries + 1} attempts; last error: {last_error}")

    def _attempt(self, pool: httpx.HTTPTransport, body: bytes, headers: httpx.Headers, want_logprobs: bool) -> Reply:
        url = self.url
        try:
            request = httpx.Request("POST", self._parsed_url, content=body, headers=headers, extensions=self._timeouts)
            response = pool.handle_request(request)
            try:
                status = response.status_code
                raw = self._read_body(response)
            finally:
                response.close()  # the connection goes back to the pool (or is dropped, after an unread body)
        except httpx.TimeoutException as e:
            if time.monotonic() >= _attempt_deadline.at:
                raise _Retryable(f"no complete answer within the {self.timeout:g}s deadline") from None
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        except httpx.RemoteProtocolError as e:
            # A body shorter than its Content-Length, or a connection dropped mid-answer.
            raise _Retryable(f"IncompleteRead or dropped connection: {e}") from None
        except httpx.HTTPError as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        except OSError as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        if 300 <= status < 400:
            raise LLMRequestError(
                f"{url} answered HTTP {status} redirecting to {response.headers.get('Location')!r}; redirects are "
                "not followed (the API key would go with them): set base_url to the final address"
            )
        if status != 200:
            detail = raw[:500].decode("utf-8", "replace")
            if status in (408, 409, 429) or status >= 500:
                raise _Retryable(
                    f"HTTP {status}: {detail}",
                    _retry_after(response.headers.get("Retry-After"), self.max_backoff),
                    throttled=status in (429, 503),
                )
            raise LLMRequestError(f"{url} answered HTTP {status}: {detail}")
        reply = _parse_reply(raw, url, want_logprobs)
        self.stats.add(
            replies=1,
            prompt_tokens=reply.usage.get("prompt_tokens", 0),
            completion_tokens=reply.usage.get("completion_tokens", 0),
        )
        return reply

    def _read_body(self, response: httpx.Response) -> bytes:
        limit = self.max_response_bytes
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise LLMRequestError(
                f"{self.url} announced a {int(length):,}-byte reply, more than max_response_bytes={limit:,}"
            )
        chunks, size = [], 0
        for chunk in response.iter_raw():
            size += len(chunk)
            if size > limit:
                raise LLMRequestError(f"{self.url} sent more than max_response_bytes={limit:,} bytes; reply refused")
            chunks.append(chunk)
        if length is not None and length.isdigit() and size != int(length):
            raise _Retryable(f"IncompleteRead: {size} of {int(length)} announced bytes")
        return b"".join(chunks)


MAX_USAGE = 1 << 53
"""Token counts above this (or below 0) are no counts: left out of ``usage`` rather than summed into reports."""


def _parse_reply(raw: bytes, url: str, want_logprobs: bool) -> Reply:
    """A 200 body as a :class:`Reply`, or :class:`_Retryable` naming why it is no answer (see the class docstring)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _Retryable(f"{url} returned a body that is not UTF-8 ({e})") from None
    except RecursionError:
        raise _Retryable(f"{url} returned JSON nested too deeply to parse; starts {raw[:40]!r}") from None
    except json.JSONDecodeError as e:
        raise _Retryable(f"{url} returned a body that is not JSON ({e}); starts {raw[:80]!r}") from None
    except ValueError as e:  # a number Python will not convert (a 4,300-digit integer)
        raise _Retryable(f"{url} returned JSON Python cannot take ({str(e)[:200]}); starts {raw[:80]!r}") from None
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message["content"]
    except (KeyError, IndexError, TypeError):
        shape = sorted(data)[:20] if isinstance(data, dict) else type(data).__name__
        raise _Retryable(f"{url} returned no choices[0].message.content; got {shape}") from None
    if not isinstance(message, dict):
        raise _Retryable(f"{url} returned a {type(message).__name__} as choices[0].message, not an object")
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    finish = finish if isinstance(finish, str) and len(finish) <= 64 else None
    reasoning = _reasoning(message)
    if content is None:
        if not (finish == "length" and reasoning):
            raise _Retryable(f"{url} returned a null message content (finish_reason {finish!r}): no answer")
        content = ""  # the budget ran out while thinking: an answer, the empty one
    if not isinstance(content, str):
        raise _Retryable(f"{url} returned a {type(content).__name__} as message content, not a string")
    for text in (content, reasoning or ""):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Retryable(f"{url} returned text with lone surrogates (\\ud800-style escapes): not text") from None
    top = _top_logprobs(choice, url) if want_logprobs else None
    return Reply(
        text=redact(content),
        reasoning=redact(reasoning) if reasoning else None,
        usage=_usage(data),
        top_logprobs=top,
        finish_reason=finish,
    )


def _reasoning(message: dict) -> str | None:
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _usage(data: dict) -> dict[str, int]:
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items()
            if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_USAGE}


MAX_TOP_LOGPROBS = 100
"""More alternatives than this in one token's ``top_logprobs`` is no vLLM/OpenAI reply (both allow at most 20)."""


def _top_logprobs(choice: dict, url: str) -> list[tuple[str, float]] | None:
    """The first token's ``(token, logprob)`` alternatives, best first; None when the server sent none.

    Raises:
        _Retryable: logprobs were sent but are no log-probabilities (not finite, above 0, wrong types): +1000
            would overflow ``math.exp`` and NaN would be written into results, so the reply is invalid.
    """
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return None
    try:
        tokens = logprobs["content"]
        if not tokens:
            return None
        first = tokens[0]["top_logprobs"]
        if not isinstance(first, list) or len(first) > MAX_TOP_LOGPROBS:
            raise TypeError(f"{type(first).__name__} of {len(first) if isinstance(first, list) else '?'} entries")
        pairs = []
        for t in first:
            token, logprob = t["token"], t["logprob"]
            if not isinstance(token, str) or isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
                raise TypeError(f"token {type(token).__name__}, logprob {type(logprob).__name__}")
            logprob = float(logprob)
            # Float rounding may leave a certain token a hair above 0; more is no log-probability.
            if not (math.isfinite(logprob) and logprob <= 1e-4):
                raise ValueError(f"logprob {logprob!r} of {token!r}")
            pairs.append((token, min(logprob, 0.0)))
    except (KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise _Retryable(f"{url} returned top_logprobs that are no log-probabilities ({str(e)[:120]})") from None
    return sorted(pairs, key=lambda p: -p[1]) or None


def _reply_from_entry(entry: dict) -> Reply:
    top = entry.get("top_logprobs")
    return Reply(
        text=entry["response"],
        reasoning=entry.get("reasoning"),
        top_logprobs=[(str(t), float(lp)) for t, lp in top] if isinstance(top, list) else None,
        finish_reason=entry.get("finish_reason"),
        cached=True,
    )
