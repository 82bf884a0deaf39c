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
from collections.abc import Iterator, Sequence
from pathlib import Path

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


@contextlib.contextmanager
def from_hub(name: str, what: str, holds: str, kind: str = "folder", repo_type: str = "model") -> Iterator[None]:
    """Around the load of a value :func:`local_or_hub` took for a hub id: a hub that cannot be reached, or has no
    such id, is an InputError saying that no such local path exists either, and what a valid one holds (a mistyped
    local path such as ``data/mmlu`` reads as an ``owner/name`` id and ends here). An unreachable hub's line also
    says how to fetch the id where the hub can be reached (``hf download``, with ``repo_type``) and pass the copy."""
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
        fetch = ""
        if reason == "cannot be reached":
            flag = "" if repo_type == "model" else f" --repo-type {repo_type}"
            fetch = (f"; for the hub's {name}, download it where the hub is reachable (`hf download {name}{flag} "
                     f"--local-dir DIR`) and pass {what} DIR")
        raise HubMissError(f"{what} {name!r} does not exist locally (no such {kind}), and the hub {reason} ({first})"
                         f"{fetch}; {holds}") from None


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
