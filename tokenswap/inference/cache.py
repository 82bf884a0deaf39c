"""The response cache every chat model shares: one append-only JSONL file keyed by a hash of the request.

A rerun of a build or an evaluation costs nothing for questions already answered. The file stays one
file that a kill cannot tear into lost entries: each entry is one ``write`` of one whole line on an
``O_APPEND`` descriptor, a torn tail left by a crash in the middle of a write is cut off when the file is
next opened (so the next entry does not glue onto it), and an entry is written at most once per key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from PIL import Image

__all__ = ["ResponseCache", "cache_key", "entry_check"]


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
        kind = part.get("type")
        if kind == "image":
            parts.append({"type": "image", "sha256": _image_digest(part["image"])})
        elif kind == "image_url":
            # A pre-encoded image (a data URL can be megabytes): its hash stands for it.
            url = part["image_url"]["url"] if isinstance(part.get("image_url"), dict) else part.get("image_url")
            parts.append({"type": "image_url", "sha256": hashlib.sha256(str(url).encode()).hexdigest()})
        else:
            parts.append({"type": kind, "text": part.get("text")})
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


MAX_TEXT_CHARS = 16 << 20
"""The longest reply text a cache entry may hold (the client refuses bodies over 16 MiB by default)."""

MAX_LINE_BYTES = 64 << 20
"""A cache line longer than this is not parsed: no entry the client writes comes near it."""

_FIELDS = {"key", "response", "reasoning", "top_logprobs", "finish_reason", "check"}


def entry_check(row: dict) -> str:
    """The checksum binding an entry's key to its content: a line edited, or copied under another key, fails it."""
    body = {k: v for k, v in row.items() if k != "check"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _entry_problem(row: Any) -> str | None:
    """Why a parsed cache line is no entry tokenswap wrote (None when it is one)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an entry"
    if set(row) - _FIELDS:
        return f"unknown fields {sorted(set(row) - _FIELDS)[:3]}"
    key, response = row.get("key"), row.get("response")
    if not isinstance(key, str) or not 0 < len(key) <= 256:
        return "a key that is no request hash"
    if not isinstance(response, str) or not response:
        return "a null, empty or non-string answer"
    if len(response) > MAX_TEXT_CHARS:
        return f"an answer of {len(response):,} characters"
    reasoning = row.get("reasoning")
    if reasoning is not None and not (isinstance(reasoning, str) and len(reasoning) <= MAX_TEXT_CHARS):
        return "a reasoning that is no string (or too long)"
    finish = row.get("finish_reason")
    if finish is not None and not (isinstance(finish, str) and len(finish) <= 64):
        return "a finish_reason that is no short string"
    top = row.get("top_logprobs")
    if top is not None:
        if not isinstance(top, list) or not 0 < len(top) <= 100:
            return "top_logprobs that are no list of 1-100 pairs"
        for pair in top:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                    and isinstance(pair[1], (int, float)) and not isinstance(pair[1], bool)
                    and math.isfinite(pair[1]) and pair[1] <= 0):
                return "top_logprobs that are no (token, log-probability <= 0) pairs"
    if row.get("check") != entry_check(row):
        return "a checksum that does not match its key and content (edited, or from an older tokenswap)"
    return None


class ResponseCache:
    """Append-only JSONL file of ``{"key", "response", ..., "check"}`` lines, loaded once into memory.

    Safe for many threads of one process (a lock serialises appends; a key already present is never
    written again, so concurrent misses of one question leave one line). Separate processes must use
    separate files (the store build keeps one per rank). A line torn by a kill mid-write is cut off
    when the file is opened, so the next append starts on a line of its own.

    Only entries this class wrote are answers: a line that is valid JSON but no entry (wrong fields or types, a
    null or empty answer, non-finite or positive logprobs, absurd sizes, JSON Python cannot parse) or whose
    ``check`` does not match its key and content is skipped, with one warning naming the file and the count;
    its question is asked again. (The checksum finds damage and copied lines; whoever can write the file can
    also forge an entry, so the cache is no security boundary.)

    Args:
        path: the JSONL file (created with its parent folder on first write).
    """

    fsync_every_s = 1.0

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._data: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()
        self._synced = 0.0
        self.skipped = 0
        """Lines of the file that were not taken as answers (torn, poisoned, from an older tokenswap)."""
        if self.path.exists():
            raw = self.path.read_bytes()
            lines = raw.splitlines()
            torn = bool(raw) and not raw.endswith(b"\n")
            first_problem = None
            for n, line in enumerate(lines, start=1):
                if not line.strip() or (torn and n == len(lines)):
                    continue  # a torn write of a killed process (only ever the last line): cut below
                problem = "a line longer than the limit" if len(line) > MAX_LINE_BYTES else None
                if problem is None:
                    try:
                        row = json.loads(line.decode("utf-8"))
                    except (UnicodeDecodeError, ValueError, RecursionError) as e:
                        problem = f"not JSON Python can read ({type(e).__name__})"
                    else:
                        problem = _entry_problem(row)
                if problem is None and row["key"] in self._data:
                    problem = "a second entry for a key (the first is kept)"
                if problem is not None:
                    self.skipped += 1
                    first_problem = first_problem or f"line {n}: {problem}"
                    continue
                self._data[row["key"]] = row
            if self.skipped:
                warnings.warn(
                    f"response cache {self.path}: {self.skipped} line(s) skipped, not answers tokenswap wrote "
                    f"(first: {first_problem}); their questions are asked again", stacklevel=2)
            if torn:
                # Cut the torn tail: appended after it, the next whole entry would be lost with it.
                with open(self.path, "r+b") as f:
                    f.truncate(raw.rfind(b"\n") + 1)
                    os.fsync(f.fileno())

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def get(self, key: str) -> str | None:
        """The cached reply text, or None."""
        row = self._data.get(key)
        return None if row is None else row["response"]

    def get_entry(self, key: str) -> dict | None:
        """The whole cached entry (``response`` plus any extra fields stored with it), or None."""
        return self._data.get(key)

    def put(self, key: str, response: str, **extra: Any) -> bool:
        """Store ``response`` (and JSON-able ``extra`` fields) under ``key``; False if the key was already there."""
        row = {"key": key, "response": response, **{k: v for k, v in extra.items() if v is not None}}
        if isinstance(row.get("top_logprobs"), (list, tuple)):
            row["top_logprobs"] = [list(pair) for pair in row["top_logprobs"]]  # as JSON reads it back
        row["check"] = entry_check(row)
        # allow_nan=False: a NaN written here would come back as an answer; the client never hands one over.
        line = (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            if key in self._data:
                return False
            if self._fd is None or self._pid != os.getpid():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._pid = os.getpid()
            view = memoryview(line)
            while view:  # one write() in practice; a short write continues the same line
                view = view[os.write(self._fd, view) :]
            self._data[key] = row
            fd = self._fd
            now = time.monotonic()
            due = now - self._synced >= self.fsync_every_s
            if due:
                self._synced = now
        # A kill loses nothing written (the page cache has it); fsync guards against a power cut, at most once per
        # `fsync_every_s` and outside the lock, so 32 threads do not each wait for a disk flush (a power cut loses
        # at most that second of answers, asked again on the rerun).
        if due:
            try:
                os.fsync(fd)
            except OSError:  # closed meanwhile by close(): the line is written all the same
                pass
        return True

    def close(self) -> None:
        with self._lock:
            if self._fd is not None and self._pid == os.getpid():
                os.fsync(self._fd)
                os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
