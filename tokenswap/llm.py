"""Chat models behind one small interface: an OpenAI-compatible endpoint or a local transformers model.

Used wherever the library asks a model a question: the LLM concept extractor, the validity
judge of the store build, the bench builder's filters. Messages are OpenAI-style
``{"role", "content"}`` dicts whose content is a string or a list of parts
``{"type": "text", "text": str}`` / ``{"type": "image", "image": PIL.Image}``.

Both implementations keep an optional JSONL response cache keyed by a hash of (model name,
generation settings, messages including image pixels), so rerunning a build or an eval costs
nothing for questions already answered. API keys are read from the environment at request time
and never enter the cache, logs or exceptions.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from PIL import Image

__all__ = [
    "ChatModel",
    "OpenAIChatModel",
    "ResponseCache",
    "TransformersChatModel",
    "cache_key",
    "parse_json_response",
]


class ChatModel(Protocol):
    """Anything that answers a conversation with one assistant reply."""

    def chat(self, messages: list[dict]) -> str:
        """Return the assistant's reply to ``messages`` (OpenAI-style, images as PIL parts)."""
        ...


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
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # torn write of a killed process
                self._data[row["key"]] = row["response"]

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


class OpenAIChatModel:
    """A model served behind ``POST {base_url}/chat/completions`` (OpenAI, vLLM, SGLang, Ollama, ...).

    Uses only the standard library. Transient failures (connection errors, timeouts, HTTP 408,
    409, 429 and 5xx) are retried with exponential backoff; other HTTP errors raise at once with
    the server's message.

    Args:
        base_url: endpoint root, e.g. ``"https://api.openai.com/v1"`` or ``"http://localhost:8000/v1"``.
        model: model name sent in the request (also part of the cache key).
        api_key_env: environment variable holding the API key; when unset no ``Authorization``
            header is sent (local servers usually need none).
        temperature: sampling temperature (0 = greedy, so cached answers are what a rerun would get).
        max_tokens: maximum completion length.
        timeout: seconds per HTTP request.
        max_retries: retries after the first attempt for transient failures.
        cache_path: JSONL response cache; ``None`` disables caching.
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
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self.num_requests = 0  # HTTP calls actually made (cache hits excluded)

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r})"

    def chat(self, messages: list[dict]) -> str:
        key = cache_key(self.model, messages, temperature=self.temperature, max_tokens=self.max_tokens)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        reply = self._request(messages)
        if self.cache is not None:
            self.cache.put(key, reply)
        return reply

    def _request(self, messages: list[dict]) -> str:
        payload = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": _to_openai_content(m["content"])} for m in messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        api_key = os.environ.get(self.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        url = f"{self.base_url}/chat/completions"
        body = json.dumps(payload).encode()
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(30.0, 0.5 * 2 ** (attempt - 1)))
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                self.num_requests += 1
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    data = json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                detail = e.read().decode("utf-8", "replace")[:500]
                if e.code in (408, 409, 429) or e.code >= 500:
                    last_error = f"HTTP {e.code}: {detail}"
                    continue
                raise RuntimeError(f"{url} answered HTTP {e.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last_error = f"{type(e).__name__}: {e}"
                continue
            try:
                content = data["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError):
                raise RuntimeError(
                    f"{url} returned no choices[0].message.content; got keys {sorted(data) if isinstance(data, dict) else type(data).__name__}"
                ) from None
            return content or ""
        raise RuntimeError(f"{url} failed after {self.max_retries + 1} attempts; last error: {last_error}")


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
