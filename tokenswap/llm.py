"""Chat models behind one small interface: an OpenAI-compatible endpoint or a local transformers model.

Used wherever the library asks a model a question: the LLM concept extractor, the validity
judge of the store build, the bench builder's filters. Messages are OpenAI-style
``{"role", "content"}`` dicts whose content is a string or a list of parts
``{"type": "text", "text": str}`` / ``{"type": "image", "image": PIL.Image}``.

Both implementations keep an optional JSONL response cache keyed by a hash of (model name,
generation settings, messages including image pixels), so rerunning a build or an eval costs
nothing for questions already answered. API keys are read from the environment at request time
and never enter the cache, logs or exceptions.

The OpenAI-compatible client is hand-written on ``http.client`` rather than the maintained
``openai`` package, after comparing the two on what a days-long unattended build needs: ``openai``
(httpx underneath) follows redirects, has per-phase timeouts that restart with every chunk read
(no deadline for a whole call) and no response size limit. This client follows no redirect (the
``Authorization`` header stays with ``base_url``'s host), enforces a deadline per attempt, caps the
response size, retries cut/garbled bodies with the URL in every error, honours ``Retry-After`` and
jitters its exponential backoff; see :class:`OpenAIChatModel`.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import http.client
import io
import json
import math
import os
import random
import re
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from PIL import Image

from tokenswap.inference.types import ChatModel, LLMRequestError

__all__ = [
    "ChatModel",
    "LLMRequestError",
    "OpenAIChatModel",
    "ResponseCache",
    "TransformersChatModel",
    "cache_key",
    "parse_json_response",
]


# ----------------------------------------------------------------------------- cache


def _image_digest(image: Image.Image) -> str:
    # Hash decoded pixels rather than an encoding: PNG bytes depend on the encoder's settings.
    h = hashlib.sha256(f"{image.mode}:{image.size}".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def _canonical_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") == "image":
            parts.append({"type": "image", "sha256": _image_digest(part["image"])})
        else:
            parts.append({"type": part.get("type"), "text": part.get("text")})
    return parts


def cache_key(model: str, messages: list[dict], **settings: Any) -> str:
    """Stable hash of a request: model name, generation settings and messages (image pixels included).

    >>> m = [{"role": "user", "content": "hi"}]
    >>> cache_key("m", m) == cache_key("m", m) != cache_key("other", m)
    True
    """
    canon = {
        "model": model,
        "settings": settings,
        "messages": [{"role": m["role"], "content": _canonical_content(m["content"])} for m in messages],
    }
    return hashlib.sha256(json.dumps(canon, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ResponseCache:
    """Append-only JSONL file of ``{"key", "response"}`` lines, loaded once into memory.

    A process killed mid-append leaves at most one truncated last line, which is skipped on load.
    Safe for threads of one process; separate processes should use separate files.

    Args:
        path: the JSONL file (created with its parent folder on first write).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._data: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.path.exists():
            for line in self.path.read_bytes().splitlines():
                try:
                    row = json.loads(line.decode("utf-8"))
                    key, response = row["key"], row["response"]
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                    continue  # torn write of a killed process
                if isinstance(key, str) and isinstance(response, str) and response:
                    self._data[key] = response

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str) -> str | None:
        return self._data.get(key)

    def put(self, key: str, response: str) -> None:
        with self._lock:
            self._data[key] = response
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                # A leading newline would protect against a torn previous line, but the loader
                # already skips it; one JSON object per line keeps the file greppable.
                f.write(json.dumps({"key": key, "response": response}, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())


# ----------------------------------------------------------------------------- OpenAI-compatible


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
        else:
            raise ValueError(f"message part type must be 'text' or 'image', got {kind!r}")
    return out


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


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


class OpenAIChatModel:
    """A model served behind ``POST {base_url}/chat/completions`` (OpenAI, vLLM, SGLang, Ollama, ...).

    Uses only the standard library (``http.client``), hardened for long unattended builds:

    - **No redirects.** A 3xx answer is an error naming the target, so the ``Authorization``
      header can never travel to another host; point ``base_url`` at the final address.
    - **A deadline per attempt**, not per socket read: connect, send, wait and read together
      take at most ``timeout`` seconds (a watchdog shuts the socket when it expires), so a server
      dripping one byte a second cannot hold a call. A call with retries is bounded by
      ``(max_retries + 1) * timeout`` plus the backoff sleeps.
    - **A response size limit** (``max_response_bytes``), checked against ``Content-Length``
      and while reading.
    - **Clear, retried failures.** Connection errors, deadline overruns, cut bodies, non-UTF-8
      or non-JSON bodies and HTTP 408/409/429/5xx are retried with exponential backoff and full
      jitter, honouring ``Retry-After``; every error names the URL. Other HTTP errors (4xx, 3xx)
      and oversized replies raise at once.
    - **Only real answers are cached**: a ``null`` or empty reply is returned as ``""`` but not
      cached, so a rerun asks again.

    Why not the maintained ``openai`` client: it (via httpx) follows redirects (stripping the
    key across origins), but its timeouts are per phase (a read timeout restarts with every
    chunk, so a slow-drip server holds a call for as long as it likes, the audit's 2 s call took
    35 s), it has no response size limit, and it would be a new dependency for one POST. It does
    honour Retry-After and jitter its backoff, which this client now does too. HTTP(S) proxies from
    the environment are not used (``http.client`` ignores them); serve the endpoint directly.

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
    ):
        self.base_url = base_url.rstrip("/")
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL such as http://localhost:8000/v1, got {base_url!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout}")
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_response_bytes = max_response_bytes
        self.max_backoff = max_backoff
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self.num_requests = 0  # HTTP calls actually made (cache hits excluded)
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r})"

    def chat(self, messages: list[dict]) -> str:
        key = cache_key(self.model, messages, temperature=self.temperature, max_tokens=self.max_tokens)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        reply = self._request(messages)
        if self.cache is not None and reply:
            self.cache.put(key, reply)
        return reply

    def _request(self, messages: list[dict]) -> str:
        payload = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": _to_openai_content(m["content"])} for m in messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        api_key = os.environ.get(self.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        url = f"{self.base_url}/chat/completions"
        body = json.dumps(payload).encode()
        last_error = ""
        retry_after: float | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                # Full jitter: ranks retrying the same overloaded server spread out instead of
                # returning together.
                delay = self._rng.uniform(0.0, min(self.max_backoff, 0.5 * 2**attempt))
                time.sleep(max(delay, retry_after or 0.0))
            self.num_requests += 1
            try:
                return self._attempt(url, body, headers)
            except _Retryable as e:
                last_error, retry_after = str(e), e.retry_after
        raise LLMRequestError(f"{url} failed after {self.max_retries + 1} attempts; last error: {last_error}")

    def _attempt(self, url: str, body: bytes, headers: dict[str, str]) -> str:
        parts = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=self.timeout)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        expired = threading.Event()

        def watchdog() -> None:
            expired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in the calling thread
                except OSError:
                    pass

        timer = threading.Timer(self.timeout, watchdog)
        timer.daemon = True
        timer.start()
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            raw = self._read_body(url, response)
        except (OSError, http.client.HTTPException) as e:
            if expired.is_set():
                raise _Retryable(f"no complete answer within the {self.timeout:g}s deadline") from None
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        finally:
            timer.cancel()
            conn.close()
        if expired.is_set():
            raise _Retryable(f"no complete answer within the {self.timeout:g}s deadline")
        status = response.status
        if 300 <= status < 400:
            raise LLMRequestError(
                f"{url} answered HTTP {status} redirecting to {response.getheader('Location')!r}; redirects are not "
                "followed (the API key would go with them): set base_url to the final address"
            )
        if status != 200:
            detail = raw[:500].decode("utf-8", "replace")
            if status in (408, 409, 429) or status >= 500:
                raise _Retryable(
                    f"HTTP {status}: {detail}", _retry_after(response.getheader("Retry-After"), self.max_backoff)
                )
            raise LLMRequestError(f"{url} answered HTTP {status}: {detail}")
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise _Retryable(f"{url} returned a body that is not UTF-8 ({e})") from None
        except json.JSONDecodeError as e:
            raise _Retryable(f"{url} returned a body that is not JSON ({e}); starts {raw[:80]!r}") from None
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            shape = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise _Retryable(f"{url} returned no choices[0].message.content; got {shape}") from None
        if content is not None and not isinstance(content, str):
            raise _Retryable(f"{url} returned a {type(content).__name__} as message content, not a string")
        return content or ""

    def _read_body(self, url: str, response: http.client.HTTPResponse) -> bytes:
        limit = self.max_response_bytes
        length = response.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise LLMRequestError(
                f"{url} announced a {int(length):,}-byte reply, more than max_response_bytes={limit:,}"
            )
        chunks, size = [], 0
        while True:
            chunk = response.read1(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise LLMRequestError(f"{url} sent more than max_response_bytes={limit:,} bytes; reply refused")
            chunks.append(chunk)
        if length is not None and length.isdigit() and size != int(length):
            raise http.client.IncompleteRead(b"".join(chunks), int(length) - size)
        return b"".join(chunks)


# ----------------------------------------------------------------------------- local transformers


class TransformersChatModel:
    """A local transformers checkpoint answering greedily.

    Text-only checkpoints load with ``AutoTokenizer`` + ``AutoModelForCausalLM``; checkpoints
    whose architecture is an image-text-to-text model (Qwen2-VL, LLaVA, ...) load with
    ``AutoProcessor`` + ``AutoModelForImageTextToText`` and accept image parts. The model is
    loaded on first use.

    Args:
        model_path: folder or hub id of the checkpoint (no download happens if offline).
        max_new_tokens: generation length.
        cache_path: JSONL response cache; ``None`` disables caching.
        device: torch device; default CUDA when available, else CPU.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        max_new_tokens: int = 256,
        cache_path: str | os.PathLike | None = None,
        device: str | None = None,
    ):
        self.model_path = str(model_path)
        self.max_new_tokens = max_new_tokens
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self.device = device
        self._model = None
        self._processor = None
        self.is_vlm: bool | None = None

    def __repr__(self) -> str:
        return f"TransformersChatModel({self.model_path!r})"

    def _load(self) -> None:
        import torch
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

        from tokenswap.cli import require_model

        require_model(self.model_path, "chat model checkpoint")
        config = AutoConfig.from_pretrained(self.model_path)
        self.is_vlm = config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.is_vlm:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            self._processor = AutoProcessor.from_pretrained(self.model_path)
            self._model = AutoModelForImageTextToText.from_pretrained(self.model_path)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self._processor = AutoTokenizer.from_pretrained(self.model_path)
            self._model = AutoModelForCausalLM.from_pretrained(self.model_path)
        self._model.to(device).eval()

    def chat(self, messages: list[dict]) -> str:
        key = cache_key(self.model_path, messages, max_new_tokens=self.max_new_tokens, greedy=True)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        reply = self._generate(messages)
        if self.cache is not None:
            self.cache.put(key, reply)
        return reply

    def _generate(self, messages: list[dict]) -> str:
        import torch

        if self._model is None:
            self._load()
        if self.is_vlm:
            # Processor chat templates expect list content everywhere.
            msgs = [
                {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                if isinstance(m["content"], str)
                else m
                for m in messages
            ]
            inputs = self._processor.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
            )
        else:
            msgs = []
            for m in messages:
                content = m["content"]
                if not isinstance(content, str):
                    if any(p.get("type") == "image" for p in content):
                        raise ValueError(
                            f"{self.model_path} is a text-only model but a message contains an image part; "
                            "use a vision-language checkpoint or send text only"
                        )
                    content = "".join(p["text"] for p in content)
                msgs.append({"role": m["role"], "content": content})
            inputs = self._processor.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
            )
        inputs = inputs.to(self._model.device)
        with torch.inference_mode():
            out = self._model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        new_tokens = out[0, inputs["input_ids"].shape[1] :]
        tokenizer = self._processor.tokenizer if self.is_vlm else self._processor
        return tokenizer.decode(new_tokens, skip_special_tokens=True)


# ----------------------------------------------------------------------------- parsing

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def parse_json_response(text: str) -> dict:
    """Extract the JSON object from a model reply, tolerating code fences and prose around it.

    Tries, in order: the whole reply, each fenced block, then the first ``{...}`` that decodes.

    Raises:
        ValueError: no JSON object in the reply; the message quotes its start.

    >>> parse_json_response('Sure! ```json\\n{"a": 1}\\n``` Hope that helps.')
    {'a': 1}
    >>> parse_json_response('The answer is {"a": [1, 2]} as requested.')
    {'a': [1, 2]}
    """
    candidates = [text.strip()] + [m.group(1).strip() for m in _FENCE.finditer(text)]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    preview = text[:200].replace("\n", " ")
    raise ValueError(f"no JSON object found in model reply: {preview!r}")
