"""The ``tokenswap`` command.

Each subcommand lives next to the code it drives and exposes ``cli_main(argv) -> int``; this
file routes, and turns a missing input into one clear line and exit code 2 instead of a
traceback, for every subcommand. It also holds the small argument checks the subcommands share
(:func:`positive_int`, :func:`require_path`, :func:`require_model`). Imports are deferred so
``tokenswap --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

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


def require_model(name: str, what: str = "--model") -> None:
    """A path-like model name must exist locally; otherwise transformers says "Repo id must be ..."."""
    if looks_like_path(name) and not os.path.exists(os.path.expanduser(name)):
        raise FileNotFoundError(
            f"{what} {name!r} does not exist locally (it looks like a path, not a hub id such as Qwen/Qwen2-VL-2B-Instruct)"
        )


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
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.cli_main(rest) or 0)
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
