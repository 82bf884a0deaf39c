"""The response cache every chat model shares: one append-only JSONL file keyed by a hash of the request.

A rerun of a build or an evaluation costs nothing for questions already answered. The file stays one
file that a kill cannot tear into lost entries: each entry is one ``write`` of one whole line on an
``O_APPEND`` descriptor, a torn tail left by a crash in the middle of a write is cut off when the file is
next opened (so the next entry does not glue onto it), and an entry is written at most once per key.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from PIL import Image

__all__ = ["ResponseCache", "cache_key"]


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


class ResponseCache:
    """Append-only JSONL file of ``{"key", "response", ...}`` lines, loaded once into memory.

    Safe for many threads of one process (a lock serialises appends; a key already present is never
    written again, so concurrent misses of one question leave one line). Separate processes must use
    separate files (the store build keeps one per rank). A line torn by a kill mid-write is cut off
    when the file is opened, so the next append starts on a line of its own.

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
        if self.path.exists():
            raw = self.path.read_bytes()
            for line in raw.splitlines():
                try:
                    row = json.loads(line.decode("utf-8"))
                    key, response = row["key"], row["response"]
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn write of a killed process (only ever the last line)
                if isinstance(key, str) and isinstance(response, str) and response:
                    self._data[key] = row
            if raw and not raw.endswith(b"\n"):
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
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
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
