"""The ``tokenswap`` command.

Each subcommand lives next to the code it drives and exposes ``cli_main(argv) -> int``; this
file routes, and turns a missing input into one clear line and exit code 2 instead of a
traceback, for every subcommand. It also holds the small checks the subcommands share, run
before any model or data loads: counts (:func:`positive_int`), inputs (:func:`require_path`,
:func:`require_model`, :func:`read_json`, :func:`require_items`) and output folders
(:func:`require_output_dir`). Each raises :class:`InputError` (or ``FileNotFoundError``), which
``tokenswap`` prints as one line naming the file or flag and the fix, with exit status 2. Imports
are deferred so ``tokenswap --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# subcommand -> (module, one-line help). A plain dict: adding a command is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "build-store": ("tokenswap.store.build", "build or resume an image store + swap dataset from a YAML config"),
    "build-bench": ("tokenswap.eval.bench_builder", "build a TokenSwap-Bench-format dataset with the three filters"),
    "eval": ("tokenswap.eval.cli", "measure the modality gap of a model on a bench (loglik or generate)"),
    "compare": ("tokenswap.compare", "compare paired runs: markdown table, plot, optional W&B report"),
    "leaderboard": ("tokenswap.eval.leaderboard", "many eval runs -> one gap table + figure (bootstrap CIs, group t-test)"),
    "crossmath": ("tokenswap.crossmath.cli", "CrossMath puzzles: generate | eval"),
    "rest": ("tokenswap.rest.cli", "REST/REST+ render-equivalence suite: build | eval"),
    "probe": ("tokenswap.rest.probe", "per-layer image/text representation similarity of a model"),
}


def _usage() -> str:
    lines = ["usage: tokenswap <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `tokenswap <command> --help` for the options of one command."]
    return "\n".join(lines)


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


def require_path(path: str, what: str, kind: str = "any") -> None:
    """Raise FileNotFoundError naming ``what`` when ``path`` is missing (or not a ``kind``: file/dir)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    if kind == "file" and not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path!r} is not a file")
    if kind == "dir" and not os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r} is not a folder")


class InputError(ValueError):
    """An input file, folder or flag a command cannot use; the message names it and the fix (exit status 2)."""


def require_model(name: str, what: str = "--model") -> None:
    """A path-like model name must exist locally; otherwise transformers says "Repo id must be ..."; an existing
    local path must be a checkpoint folder (transformers' own message for a folder without ``config.json`` names
    no flag)."""
    local = os.path.expanduser(name)
    if looks_like_path(name) and not os.path.exists(local):
        raise FileNotFoundError(
            f"{what} {name!r} does not exist locally (it looks like a path, not a hub id such as Qwen/Qwen2-VL-2B-Instruct)"
        )
    if os.path.isfile(local):
        raise InputError(f"{what} {name!r} is a file; pass a checkpoint folder (with config.json) or a hub id")
    if os.path.isdir(local) and not os.path.isfile(os.path.join(local, "config.json")):
        raise InputError(f"{what} {name!r} is a folder without config.json, not a checkpoint; pass the folder a "
                         "training run saved (output_dir or one of its checkpoint-N folders) or a hub id")


def require_output_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """``path`` as a folder to write into, created if missing; refused before any work when it cannot be one."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"{what} {str(path)!r} is a file, not a folder; pass a folder path (or move the file away)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"{what} {str(path)!r} cannot be a folder: a part of the path above it is a file") from None
    except OSError as e:
        raise InputError(f"{what} {str(path)!r}: cannot create the folder ({e.strerror or e})") from None
    return out


def read_json(path: str | os.PathLike, what: str, fix: str = "restore or regenerate it") -> Any:
    """The JSON value in ``path``; a missing, unreadable, non-UTF-8, empty or truncated file is an
    :class:`InputError` naming the file, what it is and ``fix`` (``json``'s own error names no file)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist; {fix}") from None
    except OSError as e:
        raise InputError(f"{what} {str(path)!r} cannot be read ({e.strerror or e}); {fix}") from None
    if not raw.strip():
        raise InputError(f"{what} {str(path)!r} is empty; {fix}")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {str(path)!r} is not UTF-8 text (byte {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{what} {str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}; "
                         f"truncated or overwritten?); {fix}") from None


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tokenswap: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from tokenswap.redaction import redacting_std_streams

    # Every line a command prints (its messages, progress, warnings) goes out with known secrets masked.
    with redacting_std_streams():
        return _run(name, rest)


def _run(name: str, rest: list[str]) -> int:
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.cli_main(rest) or 0)
    except InputError as e:
        print(f"tokenswap {name}: error: {e}", file=sys.stderr)
        return 2
    except FileExistsError as e:  # an output folder's path taken by a file, found where a command makes the folder
        print(f"tokenswap {name}: error: {e.filename!r} exists and is not a folder; pass a folder path (or move the "
              "file away)", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
        print(f"tokenswap {name}: error: {e.args[-1] if e.filename is None else f'{e.strerror}: {e.filename!r}'}",
              file=sys.stderr)
        return 2
    except OSError as e:
        # transformers/huggingface_hub report a missing local checkpoint as an invalid repo id.
        if "Repo id must be" not in str(e):
            raise
        print(f"tokenswap {name}: error: a model or dataset path does not exist locally and is not a hub id "
              f"({str(e).splitlines()[0]})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
