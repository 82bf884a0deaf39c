"""The checks every command runs on its inputs before any model or data loads.

Counts (:func:`positive_int`, :func:`non_negative_int`, for argparse ``type=``), paths (:func:`require_path`,
:func:`local_or_hub`, the one place that decides whether a ``--bench``/``--data``/``--model`` value is a local
path or a hub id, and :func:`require_model`), output folders (:func:`check_output_dir`, :func:`require_output_dir`) and emptiness
(:func:`require_items`). Each
raises :class:`~tokenswap.errors.InputError` (or ``FileNotFoundError``) naming the file or flag and the fix;
``tokenswap.cli.main`` prints it as one line with exit status 2. Checked file readers are in :mod:`tokenswap.files`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from tokenswap.errors import InputError

__all__ = [
    "HubMissError",
    "check_output_dir",
    "from_hub",
    "local_or_hub",
    "looks_like_path",
    "non_negative_int",
    "positive_int",
    "require_items",
    "require_model",
    "require_output_dir",
    "require_path",
]


def looks_like_path(name: str) -> bool:
    """Whether a model or dataset name is meant as a local path rather than a hub id.

    A hub id is ``name`` or ``owner/name``; anything starting with ``/ . ~``, with two or more
    slashes, or with a file suffix is a path, and when it does not exist it is a typo, not a
    download to attempt.
    """
    return (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
        or Path(name).suffix.lower() in (".jsonl", ".json", ".parquet", ".txt", ".csv", ".yaml", ".safetensors")
    )


def local_or_hub(name: str | os.PathLike, what: str, holds: str, hub: bool = True, kind: str = "folder") -> Path | None:
    """The local path ``name`` means, or None when it is a hub id to load as such.

    A value that exists locally is that path. One that does not is a hub id only where ``hub`` is allowed and it
    reads as one (``name`` or ``owner/name``, :func:`looks_like_path`); anything else (``.cache/tiny-bench``,
    ``a/b/c``, ``rows.jsonl``) is a missing or mistyped path, refused here with what a valid one holds, rather
    than sent to the hub, whose answer (``Repo id must use alphanumeric chars``) names neither.

    Args:
        name: the flag's value.
        what: the flag (``--bench``), as the message names it.
        holds: what a valid value is or holds, the message's fix (``a bench folder holds text/ and img/ ...``).
        hub: whether a hub id is a valid value at all.
        kind: ``folder`` or ``file or folder``, for the message.

    Raises:
        InputError: ``{what} '{name}' does not exist: no such {kind}; {holds}`` (exit status 2).
    """
    local = Path(os.path.expanduser(str(name)))
    if local.exists():
        return local
    if hub and not looks_like_path(str(name)):
        return None
    raise InputError(f"{what} {str(name)!r} does not exist{' locally' if hub else ''}: no such {kind}; {holds}"
                     f"{tiny_kit_hint(name)}")


# What the hub libraries raise for an id they cannot serve (by name: this floor imports neither library), and the
# words transformers wraps the same misses in when it re-raises them as a bare OSError.
_HUB_MISSES = ("DatasetNotFoundError", "RepositoryNotFoundError", "HFValidationError", "OfflineModeIsEnabled")
_UNREACHABLE = ("couldn't connect to", "couldn't reach", "offline mode")
_NO_SUCH_ID = ("is not a valid model identifier", "repo id must", "doesn't exist on the hub")


class HubMissError(InputError):
    """A value :func:`local_or_hub` took for a hub id that the hub cannot serve (unreachable, or no such id); the
    message already names the flag and the fix, so a caller that prefixes its own errors passes this one on."""


# How long the one probe of the hub may take before an id that is not in the local cache is refused: the hub
# libraries' own retries on a machine without network take ~47 s and print a warning per retry.
_PROBE_S = 3.0
_TRUE = ("1", "true", "yes", "on")


def _in_hub_cache(name: str, repo_type: str) -> bool:
    """Whether the hub cache holds a copy of ``name`` (then the libraries load it without the network)."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    return os.path.isdir(os.path.join(hub, f"{repo_type}s--{name.replace('/', '--')}"))


def _hub_unreachable(name: str, repo_type: str) -> str | None:
    """Why the hub cannot serve ``name`` now (``HF_HUB_OFFLINE`` set, or one short connection probe failed), or
    ``None`` when it may: a cached copy, a proxy (the probe would not go through it) or a reachable endpoint."""
    if _in_hub_cache(name, repo_type):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return "cannot be reached (HF_HUB_OFFLINE is set, and the local hub cache holds no copy)"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result: list[BaseException | None] = []

    def probe() -> None:  # in a thread: a name lookup without network can hang past any socket timeout
        try:
            socket.create_connection((host, port), timeout=_PROBE_S).close()
            result.append(None)
        except OSError as e:
            result.append(e)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(_PROBE_S)
    if not result:
        return f"cannot be reached ({host}:{port} did not answer within {_PROBE_S:.0f} s)"
    if result[0] is not None:
        e = result[0]
        return f"cannot be reached ({host}:{port}: {getattr(e, 'strerror', None) or e})"
    return None


def _fetch_elsewhere(name: str, what: str, holds: str, repo_type: str) -> str:
    """How to use ``name`` without this machine reaching the hub, and what a valid local value holds (without the
    "or pass a hub id such as ..." of ``holds``: a hub id is what just failed)."""
    flag = "" if repo_type == "model" else f" --repo-type {repo_type}"
    local = re.sub(r"[;,]? or (?:pass )?a hub id(?: such as \S+)?$", "", holds)
    return (f"download it where the hub is reachable (`hf download {name}{flag} --local-dir DIR`), copy DIR here "
            f"and pass {what} DIR; {local}")


@contextlib.contextmanager
def from_hub(name: str, what: str, holds: str, kind: str = "folder", repo_type: str = "model") -> Iterator[None]:
    """Around the load of a value :func:`local_or_hub` took for a hub id: a hub that cannot be reached, or has no
    such id, is an InputError saying that no such local path exists either, and what a valid one holds (a mistyped
    local path such as ``data/mmlu`` reads as an ``owner/name`` id and ends here). An unreachable hub's line also
    says how to fetch the id where the hub can be reached (``hf download``, with ``repo_type``) and pass the copy.

    An id not in the local hub cache is refused within seconds when ``HF_HUB_OFFLINE`` is set or one short probe of
    the hub's endpoint fails, before the libraries' own retries (~47 s, a warning each)."""
    if not os.path.exists(os.path.expanduser(name)) and (why := _hub_unreachable(name, repo_type)) is not None:
        raise HubMissError(f"{what} {name!r} does not exist locally (no such {kind}), and the hub {why}: "
                           f"{_fetch_elsewhere(name, what, holds, repo_type)}")
    try:
        yield
    except Exception as e:
        said = str(e).lower()
        if isinstance(e, ConnectionError) or any(w in said for w in _UNREACHABLE):
            reason = "cannot be reached"
        elif type(e).__name__ in _HUB_MISSES or (isinstance(e, OSError) and any(w in said for w in _NO_SUCH_ID)):
            reason = "has no such id"
        else:
            raise
        if os.path.exists(os.path.expanduser(name)):  # a local path: whatever failed, it was no hub lookup
            raise
        first = (str(e).splitlines() or [type(e).__name__])[0]
        fix = _fetch_elsewhere(name, what, holds, repo_type) if reason == "cannot be reached" else holds
        raise HubMissError(f"{what} {name!r} does not exist locally (no such {kind}), and the hub {reason} ({first})"
                           f"; {fix}") from None


MODEL_HOLDS = ("a checkpoint folder holds config.json and the weights (a training run's output_dir or one of its "
               "checkpoint-N folders); or pass a hub id such as Qwen/Qwen2-VL-2B-Instruct")


def tiny_kit_hint(path) -> str:
    """``; build it with `python -m tokenswap.testing .cache` ...`` for a missing path of the tiny kit
    (``.cache/tiny-*``: the README's and the tiny configs' model, store and bench), else ``""``."""
    parts = Path(str(path)).parts
    if any(a == ".cache" and b.startswith("tiny-") for a, b in zip(parts, parts[1:])):
        return "; the tiny kit is not built here: run `python -m tokenswap.testing .cache` from the repository root"
    return ""


def require_path(path: str, what: str, kind: str = "any") -> None:
    """Raise FileNotFoundError naming ``what`` when ``path`` is missing (or not a ``kind``: file/dir)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} {path!r} does not exist{tiny_kit_hint(path)}")
    if kind == "file" and not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path!r} is not a file")
    if kind == "dir" and not os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r} is not a folder")


def require_model(name: str, what: str = "--model") -> None:
    """A path-like model name must exist locally; otherwise transformers says "Repo id must be ..."; an existing
    local path must be a checkpoint folder (transformers' own message for a folder without ``config.json`` names
    no flag); :func:`tokenswap.families.check_checkpoint` checks what the folder holds."""
    if local_or_hub(name, what, MODEL_HOLDS) is None:
        return
    local = os.path.expanduser(name)
    if os.path.isfile(local):
        raise InputError(f"{what} {name!r} is a file; pass a checkpoint folder (with config.json) or a hub id")
    if os.path.isdir(local) and not os.path.isfile(os.path.join(local, "config.json")):
        raise InputError(f"{what} {name!r} is a folder without config.json, not a checkpoint; pass the folder a "
                         "training run saved (output_dir or one of its checkpoint-N folders) or a hub id")


def check_output_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """Refuse ``path`` as an output folder when it is a file or lies under one, creating nothing (so the inputs can
    be checked next, and a refused command leaves no empty folder behind)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"{what} {str(path)!r} is a file, not a folder; pass a folder path (or move the file away)")
    above = next((p for p in out.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(f"{what} {str(path)!r} cannot be a folder: a part of the path above it is a file")
    return out


def require_output_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """``path`` as a folder to write into, created if missing; refused before any work when it cannot be one."""
    out = check_output_dir(path, what)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"{what} {str(path)!r} cannot be a folder: a part of the path above it is a file") from None
    except OSError as e:
        raise InputError(f"{what} {str(path)!r}: cannot create the folder ({e.strerror or e})") from None
    return out


def require_items(items: Sequence, source: str, what: str, fix: str) -> None:
    """An input that holds nothing to evaluate is an error, not an empty report (or ``min()`` of nothing)."""
    if not items:
        raise InputError(f"{source} holds no {what}; {fix}")


def _whole_number(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type=`` for counts: an integer >= 1 (``--n -1`` is an error, not "nothing")."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """argparse ``type=`` for seeds and offsets: an integer >= 0."""
    return _whole_number(text, 0)
