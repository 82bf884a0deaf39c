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

import errno
import json
import logging
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
    "command_line_secret",
    "mask_secrets",
    "public_url",
    "redact",
    "redact_argv",
    "redact_data",
    "redacted_argv",
    "redacting_std_streams",
    "remember",
    "remember_env",
    "script_streams",
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
_lock = threading.Lock()  # guards _values, _envs and _forms; a fresh one in a forked child (_after_fork_in_child)
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
        with _lock:
            forms = _forms.get((value, label))
        if forms is None:  # computed outside the lock: two threads may both compute it, to the same list
            forms = [(form, label) for form in _encoded_forms(value)]
            with _lock:
                forms = _forms.setdefault((value, label), forms)
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
    secrets = _known()
    return _redact(text, _forms_of(secrets) if secrets else [])


def _redact(text: str, forms: list[tuple[str, str]]) -> str:
    """:func:`redact` with the secrets' forms already looked up (once for a whole record)."""
    if "@" in text or "%40" in text.lower():
        text = _URL_USERINFO.sub(r"\g<scheme><CREDENTIALS>@", text)
        text = _URL_USERINFO_ENCODED.sub(r"\g<scheme>%3CCREDENTIALS%3E%40", text)
    if not forms:
        return text
    masks: list[tuple[int, int, str]] = []
    for form, label in forms:
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
    secrets = _known()  # once for the whole value: a record holds dozens of strings, each looked up before
    return _redact_data(value, _forms_of(secrets) if secrets else [])


def _redact_data(value: Any, forms: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        return _redact(value, forms) if value else value
    if isinstance(value, dict):
        return {_redact_data(k, forms): _redact_data(v, forms) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_data(v, forms) for v in value)
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


_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]+@")


def _secret_home(key: str, argv: Sequence[str]) -> str:
    """Where the secret of the command-line setting ``key`` belongs instead (a variable, a login, the YAML)."""
    name = _option_name(key).lower()
    if "wandb" in key.lower():
        return "set WANDB_API_KEY in the environment instead (or run `wandb login`)"
    if "hub" in key.lower() or name in ("token", "hf_token", "hub_token"):
        return "set HF_TOKEN in the environment instead (or run `hf auth login`)"
    if "api_key" in name or "base_url" in key.lower().replace("-", "_"):
        env = "OPENAI_API_KEY"
        section = key.rpartition(".")[0]
        for i, arg in enumerate(argv):  # the variable this command line names for the key, if it names one
            if arg == "--api-key-env" and i + 1 < len(argv):
                env = argv[i + 1]
            elif arg.startswith("--api-key-env=") or (section and arg.startswith(f"{section}.api_key_env=")):
                env = arg.split("=", 1)[1]
        return f"set {env} (the variable `api_key_env` / --api-key-env names) in the environment instead"
    return "put it in the YAML config (--config) instead"


def command_line_secret(argv: Sequence[str]) -> str | None:
    """Why ``argv`` may not be run, when it carries a secret, or None; the message never holds the secret.

    A command line is not a place for a secret: it shows in ``ps``, in shell history and job scripts, and a
    launcher quotes it whole when the run fails (``accelerate launch`` raises ``CalledProcessError`` with the
    command). Refused: a secret-named override (``train.hub_token=...``, :data:`SECRET_NAME`), a secret-named flag
    with a value (``--api-key X``, ``--hub-token=X``) and any URL carrying a user or password
    (``https://user:pw@host``). The value is remembered as well, so that nothing printed later shows it.

    >>> print(command_line_secret(["--config", "c.yaml", "train.hub_token=hf_0123456789"]))  # doctest: +ELLIPSIS
    `train.hub_token` on the command line: ...; set HF_TOKEN in the environment instead (or run `hf auth login`)
    """
    redact_argv(argv)  # remembered first: whatever fails after this prints it masked
    why = ("a command line shows in `ps`, in shell history and in a launcher's error output, so its value was not "
           "used")
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if (eq and SECRET_NAME.search(_option_name(key))
                and value.strip("[]'\" ").lower() not in ("", "null", "none", "~")):  # unsetting one is no secret
            return f"`{key}` on the command line: {why}; {_secret_home(key, argv)}"
        if (not eq and arg.startswith("-") and SECRET_NAME.search(_option_name(arg)) and i + 1 < len(argv)
                and not argv[i + 1].startswith("-")):
            return f"`{arg}` on the command line: {why}; {_secret_home(arg, argv)}"
        if _USERINFO.search(arg) or _URL_USERINFO_ENCODED.search(arg):
            where = f"`{key}`" if eq else (f"`{argv[i - 1]}`" if i and argv[i - 1].startswith("-") else "an argument")
            return (f"{where} on the command line is a URL carrying a user or password: {why}; drop the "
                    f"`user:password@` and {_secret_home(where if where != 'an argument' else '', argv)}")
    return None


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
    into each other's lines mid-line. Holding the line also masks a secret that arrived in pieces. The held text is
    each thread's own: two threads printing at once give two whole lines, never one glued line. A line longer
    than :attr:`HOLD_LIMIT` without a newline goes out as it is (nothing is held without bound); :meth:`flush` sends
    the calling thread's held text and the end of :func:`redacting_std_streams` every thread's, so a progress bar
    that flushes is shown at once.

    A write to a pipe whose reader closed it (``| head``) raises :class:`tokenswap.errors.OutputClosedError` once,
    which :func:`tokenswap.errors.exit_status` turns into a quiet exit; what is written after it goes nowhere. Outside
    a redacting block (a script's imports, before :func:`tokenswap.script.run_script`), nothing catches it yet: the
    closed reader is noted and said at the first write inside the block.
    """

    HOLD_LIMIT = 1 << 16

    def __init__(self, inner):
        self._inner = inner
        self._held: dict[int, str] = {}  # thread ident -> its text not yet sent
        # Reentrant: a warning raised while a line goes out is printed through this same stream by the same thread.
        self._lock = threading.RLock()
        self._closed_by_reader = False
        self._told = False  # OutputClosedError raised
        self.defer_closed = False  # note a closed reader without raising (no exit_status around the write)
        _STREAMS.add(self)

    def _after_fork_in_child(self) -> None:
        # A forked child (a data-loader worker) starts with a copy of this stream: the held text is the parent's to
        # send (sent twice otherwise), and a lock another parent thread held at the fork would never be released.
        self._held = {}
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        me = threading.get_ident()
        with self._lock:
            held = self._held.pop(me, "") + text
            cut = held.rfind("\n") + 1
            if not cut and len(held) >= self.HOLD_LIMIT:
                cut = len(held)
            if held[cut:]:
                self._held[me] = held[cut:]
            if cut:
                self._send(held[:cut])
        return len(text)

    def _fd(self) -> int | None:
        try:
            return self._inner.fileno()
        except (AttributeError, OSError, ValueError):
            return None

    def _send(self, text: str, flush: bool = False) -> None:
        if not self._closed_by_reader:
            try:
                if text:
                    self._inner.write(redact(text))
                if flush:
                    self._inner.flush()
                return
            except BrokenPipeError:
                self._closed_by_reader = True
                if self.defer_closed:  # the interpreter's last flush of the inner stream goes nowhere, quietly
                    OutputClosedError(fd=self._fd()).silence()
        # The reader went away: there is no one left to show it to. Said once, where exit_status can hear it.
        if self._told or self.defer_closed:
            return
        self._told = True
        raise OutputClosedError(errno.EPIPE, os.strerror(errno.EPIPE), fd=self._fd())

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            self._send(self._held.pop(threading.get_ident(), ""), flush=True)

    def flush_all(self) -> None:
        """Send every thread's held text (the end of a redacting block: no thread will finish its line)."""
        with self._lock:
            held, self._held = "".join(self._held.values()), {}
            self._send(held, flush=True)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


_STREAMS: weakref.WeakSet[RedactingStream] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The module lock too: a parent thread inside redact() at the fork would leave the child's copy held for ever.
    global _lock
    _lock = threading.Lock()
    for stream in list(_STREAMS):
        stream._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every logging StreamHandler alive: on a logger, or made and kept elsewhere (logging lists them all)."""
    found: dict[int, logging.StreamHandler] = {}
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    handlers += [ref() for ref in list(getattr(logging, "_handlerList", []))]
    for h in handlers:
        # "stream" an attribute of its own: logging's last-resort handler reads sys.stderr at each record already
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) and "stream" in vars(h):
            found[id(h)] = h
    return list(found.values())


def _rebind_handlers(streams: dict[int, Any]) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every StreamHandler whose stream is a key (by identity) of ``streams`` at its value; returns
    (handler, old stream) for the way back. A library's handler holds the ``sys.stderr`` of its import, which
    bypasses the redaction (and the whole lines) when it was made before the redacting streams."""
    moved = []
    for h in _stream_handlers():
        new = streams.get(id(h.stream))
        if new is not None and new is not h.stream:
            h.acquire()
            try:
                moved.append((h, h.stream))
                h.stream = new  # (not setStream: its flush of the old stream may meet a closed reader)
            finally:
                h.release()
    return moved


def script_streams() -> None:
    """Redacting ``sys.stdout``/``sys.stderr`` for the rest of the process, from a script's first lines.

    A recipe's imports print (transformers, DeepSpeed) and make their log handlers before its ``__main__`` block
    runs: installed first, both go through the redaction, whole lines, and a reader gone during the imports is noted
    quietly (the run then says its error line, or ends 141 at its first output, instead of a traceback from an
    import). :func:`redacting_std_streams` (around the run itself) uses these streams as they are.
    """
    pairs = []
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if current is None or isinstance(current, RedactingStream):
            continue
        stream = RedactingStream(current)
        stream.defer_closed = True
        setattr(sys, name, stream)
        pairs.append((current, stream))
    _rebind_handlers({id(old): new for old, new in pairs})


@contextmanager
def redacting_std_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted for the duration (a command's messages, warnings, tracebacks), and
    every logging StreamHandler bound to them (a library's, made at its import) writing through them; both
    restored after."""
    saved = sys.stdout, sys.stderr
    streams = tuple(s if isinstance(s, RedactingStream) else RedactingStream(s) for s in saved)
    made = [s for s, old in zip(streams, saved) if s is not old]
    deferred = [s.defer_closed for s in streams]
    for s in streams:
        s.defer_closed = False
    sys.stdout, sys.stderr = streams
    moved = _rebind_handlers({id(s._inner): s for s in made})
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for h, old in moved:
            h.stream = old
        _rebind_handlers({id(s): s._inner for s in made})  # handlers made inside the block: back to the inner
        for stream, defer in zip(streams, deferred):
            stream.defer_closed = defer
            try:
                stream.flush_all()
            except OutputClosedError as e:  # the reader left after the command's last full line: nothing to tell it
                e.silence()
