"""One redaction for everything tokenswap writes: errors, reports, markers, records, logs, W&B, pickled arguments.

A secret reaches a sink in more forms than the one it was typed in: a server's error body quotes the
``Authorization`` header JSON-escaped or URL-encoded, a message cut at 500 characters keeps only the key's start,
a model echoes the key in its reply. This module knows the secrets in play and masks every form of them:

- **Which secrets.** Values remembered with :func:`remember` (what :func:`mask_secrets` masked by field name:
  ``hub_token``, ``api_key``, ``*_secret``, ``password``; the ``user:password@`` of a URL; a secret-named
  command-line override), and the current value of every environment variable remembered with
  :func:`remember_env` (each chat client's ``api_key_env``; ``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN`` and
  ``WANDB_API_KEY`` always), read at each call so a rotated key is masked too.
- **Which forms.** The value as is; JSON-escaped (``\\"``, ``\\uXXXX``, ``\\/``, and escaped twice, as a JSON body
  quoted inside another); percent-encoded (``%2F`` and ``%2f``, ``/`` kept or encoded) and in the ``+`` form of
  query strings; and cut: any prefix or suffix of one of those forms at least :data:`MIN_CUT` characters long.
  A ``scheme://user:password@`` in any text (also ``:\\/\\/`` and ``%3A%2F%2F``) loses its user info.
- **What is masked.** A secret of fewer than :data:`MIN_SECRET` characters is not remembered: masking every
  occurrence of a 3-letter value would garble records and hides nothing worth hiding.

The mask names what was there: ``[API key]``, ``[hub token]``, ``[secret]``; a masked URL keeps its host
(``https://<CREDENTIALS>@host/v1``); a secret-named field becomes ``<FIELD_NAME>`` (transformers' own way of
printing ``hub_token``). Nothing here imports the rest of tokenswap but the ground floor's :mod:`tokenswap.errors`, so
every module may use it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import urllib.parse
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tokenswap.errors import OutputClosedError

__all__ = [
    "MIN_CUT",
    "MIN_SECRET",
    "SECRET_NAME",
    "RedactingStream",
    "base_url_problem",
    "mask_secrets",
    "public_url",
    "redact",
    "redact_argv",
    "redact_data",
    "redacted_argv",
    "redacting_std_streams",
    "remember",
    "remember_env",
]

MIN_CUT = 8
"""The shortest cut of a secret that is masked: a prefix or suffix of 8 characters of an encoded secret. Fewer
characters of a random key narrow it down by too little to matter; a cut of a key at a fixed length (a server's
error body truncated at 500 bytes) almost always leaves more."""

MIN_SECRET = 6
"""Secrets shorter than this are not remembered (see the module docstring)."""

SECRET_NAME = re.compile(r"(^|_)(token|api_?key|secret|password|passwd|credentials?|auth)$", re.IGNORECASE)
"""Field names whose values are credentials (``hub_token``, ``api_key``, ``*_secret``, ...), judged by name alone
so that a secret field a new transformers/TRL release adds is masked the day it appears."""

_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:(?:\\?/){2})[^/\\@\s\"'<>]+@")
_URL_USERINFO_ENCODED = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*%3A%2F%2F)(?:(?!%2F|%40)[^/@\s\"'<>])+%40",
                                   re.IGNORECASE)

_MASK = re.compile(r"<[A-Z0-9_]+>|\[[A-Za-z&][A-Za-z& ]*\]|\*+")  # what this module and transformers mask with
_lock = threading.Lock()
_values: dict[str, str] = {}  # secret -> label of its mask
_envs: dict[str, str] = {"HF_TOKEN": "hub token", "HUGGING_FACE_HUB_TOKEN": "hub token", "WANDB_API_KEY": "W&B key"}
_forms: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (secret, label) -> its encoded forms, cached


def remember(value: Any, label: str = "secret") -> None:
    """Mask ``value`` (every form of it) in everything redacted from now on; short or empty values are ignored."""
    if not isinstance(value, str) or len(value) < MIN_SECRET or _MASK.fullmatch(value):
        return  # (a value already masked upstream, transformers' "<HUB_TOKEN>", is no secret)
    with _lock:
        _values.setdefault(value, label)


def remember_env(name: str | None, label: str = "API key") -> None:
    """Mask the value the environment variable ``name`` holds at each redaction (a rotated key included)."""
    if name:
        with _lock:
            _envs.setdefault(name, label)


def _known() -> list[tuple[str, str]]:
    with _lock:
        found = dict(_values)
        envs = dict(_envs)
    for name, label in envs.items():
        value = os.environ.get(name)
        if value and len(value) >= MIN_SECRET:
            found.setdefault(value, label)
    return sorted(found.items(), key=lambda kv: -len(kv[0]))  # longest first: a secret inside another is covered


def _json_escaped(value: str) -> list[str]:
    once = [json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]]
    once += [v.replace("/", "\\/") for v in once]
    twice = [json.dumps(v)[1:-1] for v in once]
    return once + twice


def _encoded_forms(value: str) -> list[str]:
    """The forms a secret takes in text: as is, JSON-escaped, percent-encoded and in the ``+`` form."""
    forms = [value, *_json_escaped(value)]
    for quoted in (urllib.parse.quote(value, safe=""), urllib.parse.quote(value), urllib.parse.quote_plus(value)):
        forms += [quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted)]
    return list(dict.fromkeys(forms))  # unique, in order


def _forms_of(secrets: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for value, label in secrets:
        forms = _forms.get((value, label))
        if forms is None:
            forms = [(form, label) for form in _encoded_forms(value)]
            _forms[(value, label)] = forms
        out += forms
    return out


def _spans(text: str, form: str) -> Iterator[tuple[int, int]]:
    """Where ``form`` or a cut of it (a prefix or suffix of at least MIN_CUT characters) occurs in ``text``."""
    if len(form) <= MIN_CUT:
        start = text.find(form)
        while start >= 0:
            yield start, start + len(form)
            start = text.find(form, start + 1)
        return
    head, tail = form[:MIN_CUT], form[-MIN_CUT:]
    start = text.find(head)
    while start >= 0:  # a prefix: extend while the text goes on as the form does
        end, i = start + MIN_CUT, MIN_CUT
        while i < len(form) and end < len(text) and text[end] == form[i]:
            end, i = end + 1, i + 1
        yield start, end
        start = text.find(head, start + 1)
    end = text.find(tail)
    while end >= 0:  # a suffix: extend backwards
        stop = end + MIN_CUT
        begin, i = end, len(form) - MIN_CUT - 1
        while i >= 0 and begin > 0 and text[begin - 1] == form[i]:
            begin, i = begin - 1, i - 1
        yield begin, stop
        end = text.find(tail, end + 1)


def redact(text: str) -> str:
    """``text`` with every known secret masked, in any of its forms (see the module docstring).

    >>> remember("sk-doctest-0123456789", "API key")
    >>> redact('401: {"auth": "Bearer sk-doctest-0123456789"} and sk-doctest-01... and https://u:pw@h/v1')
    '401: {"auth": "Bearer [API key]"} and [API key]... and https://<CREDENTIALS>@h/v1'
    """
    if not isinstance(text, str) or not text:
        return text
    if "@" in text or "%40" in text.lower():
        text = _URL_USERINFO.sub(r"\g<scheme><CREDENTIALS>@", text)
        text = _URL_USERINFO_ENCODED.sub(r"\g<scheme>%3CCREDENTIALS%3E%40", text)
    secrets = _known()
    if not secrets:
        return text
    masks: list[tuple[int, int, str]] = []
    for form, label in _forms_of(secrets):
        masks += [(a, b, label) for a, b in _spans(text, form)]
    if not masks:
        return text
    masks.sort()
    out, at = [], 0
    merged: list[list] = []
    for a, b, label in masks:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b, label])
    for a, b, label in merged:
        out += [text[at:a], f"[{label}]"]
        at = b
    out.append(text[at:])
    return "".join(out)


def redact_data(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dict keys and values, lists, tuples).

    Field names are not judged here: a record's ``{"token": "A"}`` is data, not a credential (configs are masked
    by name with :func:`mask_secrets`).
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value)
    return value


def _remember_url_credentials(value: str) -> None:
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9+.-]*://([^/@\s]+)@", value):
        userinfo = urllib.parse.unquote(m.group(1))
        user, _, password = userinfo.partition(":")
        remember(password or user, "credentials")


def mask_secrets(value: Any, name: str = "") -> Any:
    """A config's ``value`` with every credential masked, recursively, and remembered for :func:`redact`.

    A field named like a secret (:data:`SECRET_NAME`) becomes ``<NAME>`` as transformers prints ``hub_token``
    (``<HUB_TOKEN>``), ``user:password@`` in a URL becomes ``<CREDENTIALS>@``, and any known secret in a string
    is masked. Unset secrets (None, "") stay as they are: they say nothing.
    """
    if isinstance(value, dict):
        return {k: mask_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_secrets(v, name) for v in value)
    if SECRET_NAME.search(name) and value not in (None, ""):
        remember(str(value), name.replace("_", " "))
        return f"<{name.upper()}>"
    if isinstance(value, str):
        _remember_url_credentials(value)
        return redact(value)
    return value


def _option_name(arg: str) -> str:
    return arg.lstrip("-").rsplit(".", 1)[-1].replace("-", "_")


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with its secrets masked: ``train.hub_token=X`` and ``--api-key X`` lose ``X`` (remembered),
    URL credentials and known secrets are masked in every argument.

    >>> redact_argv(["--config", "c.yaml", "train.hub_token=hf_0123456789", "--api-key", "abcdef123"])
    ['--config', 'c.yaml', 'train.hub_token=<HUB_TOKEN>', '--api-key', '<API_KEY>']
    """
    out: list[str] = []
    hide_next = ""
    for arg in argv:
        if hide_next:
            remember(arg, hide_next.replace("_", " "))
            out.append(f"<{hide_next.upper()}>")
            hide_next = ""
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
            name = _option_name(key)
            if SECRET_NAME.search(name) and value:
                for form in {value, value.strip("[]'\" ")}:  # also the scalar of a YAML list or quoted value
                    remember(form, name.replace("_", " "))
                out.append(f"{key}=<{name.upper()}>")
                continue
            _remember_url_credentials(value)
        elif arg.startswith("-") and SECRET_NAME.search(_option_name(arg)):
            hide_next = _option_name(arg)
        out.append(redact(arg))
    return out


@contextmanager
def redacted_argv() -> Iterator[None]:
    """``sys.argv`` with its secrets masked for the duration (W&B records the command line at ``wandb.init``)."""
    saved = sys.argv
    sys.argv = [*saved[:1], *redact_argv(saved[1:])]
    try:
        yield
    finally:
        sys.argv = saved


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment: what a result file may name (a key never rides along).

    >>> public_url("https://user:secret@api.example.com/v1?key=abc")
    'https://api.example.com/v1'
    """
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname or "", parts.port
    except ValueError:  # a port that is no number: name the URL without it
        host, port = parts.hostname or "", None
    if port:
        host += f":{port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def base_url_problem(url: str, key: str = "base_url", api_key_env: str = "api_key_env") -> str | None:
    """What is wrong with an endpoint URL a config or flag takes, or None; never quotes a credential.

    Refused: a scheme other than http(s), no host, and ``user:password@`` or a query (they would travel into
    error messages and result files, and credentials belong in the environment).
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return f"`{key}` must be an http(s) URL such as http://localhost:8000/v1, got an unparsable URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"`{key}` must be an http(s) URL such as http://localhost:8000/v1, got {redact(public_url(url))!r}"
    if parts.username or parts.password or parts.query:
        _remember_url_credentials(url)
        return (f"`{key}` must carry no user, password or query ({public_url(url)!r} without them): put the key in "
                f"the environment variable `{api_key_env}` names")
    return None


class RedactingStream:
    """A text stream (``sys.stdout``, ``sys.stderr``) that masks known secrets and hands its inner stream whole lines.

    Text is held until its line ends (or :meth:`flush`), then the line goes out in one write: ``print`` writes its
    arguments and its ``end`` separately, and where the inner stream writes through (``PYTHONUNBUFFERED=1``, common
    in cluster jobs and CI) each piece is a ``write(2)`` of its own, so the ranks of a launch sharing one stderr cut
    into each other's lines mid-line. Holding the line also masks a secret that arrived in pieces. A line longer
    than :attr:`HOLD_LIMIT` without a newline goes out as it is (nothing is held without bound); :meth:`flush`, and
    the end of :func:`redacting_std_streams`, send what is held, so a progress bar that flushes is shown at once.

    A write to a pipe whose reader closed it (``| head``) raises :class:`tokenswap.errors.OutputClosedError` once,
    which :func:`tokenswap.errors.exit_status` turns into a quiet exit; what is written after it goes nowhere.
    """

    HOLD_LIMIT = 1 << 16

    def __init__(self, inner):
        self._inner = inner
        self._held = ""
        # Worker threads print too (the held text is one line, not one per thread). Reentrant: a warning raised
        # while a line goes out is printed through this same stream by the same thread.
        self._lock = threading.RLock()
        self._closed_by_reader = False
        _STREAMS.add(self)

    def _after_fork_in_child(self) -> None:
        # A forked child (a data-loader worker) starts with a copy of this stream: the held text is the parent's to
        # send (sent twice otherwise), and a lock another parent thread held at the fork would never be released.
        self._held = ""
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        with self._lock:
            self._held += text
            cut = self._held.rfind("\n") + 1
            if not cut and len(self._held) >= self.HOLD_LIMIT:
                cut = len(self._held)
            if cut:
                out, self._held = self._held[:cut], self._held[cut:]
                self._send(out)
        return len(text)

    def _send(self, text: str, flush: bool = False) -> None:
        if self._closed_by_reader:
            return  # the reader went away: there is no one left to show it to
        try:
            if text:
                self._inner.write(redact(text))
            if flush:
                self._inner.flush()
        except BrokenPipeError as e:
            self._closed_by_reader = True
            try:
                fd = self._inner.fileno()
            except (AttributeError, OSError, ValueError):
                fd = None
            raise OutputClosedError(*e.args, fd=fd) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            out, self._held = self._held, ""
            self._send(out, flush=True)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


_STREAMS: weakref.WeakSet[RedactingStream] = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [stream._after_fork_in_child() for stream in list(_STREAMS)])


@contextmanager
def redacting_std_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted for the duration (a command's messages, warnings, tracebacks)."""
    saved = sys.stdout, sys.stderr
    streams = RedactingStream(saved[0]), RedactingStream(saved[1])
    sys.stdout, sys.stderr = streams
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for stream in streams:
            try:
                stream.flush()
            except OutputClosedError as e:  # the reader left after the command's last full line: nothing to tell it
                e.silence()
