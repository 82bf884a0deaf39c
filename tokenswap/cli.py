"""The ``tokenswap`` command.

Each subcommand lives next to the code it drives and exposes ``cli_main(argv) -> int``; this
file only routes. Imports are deferred so ``tokenswap --help`` stays instant.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help). A plain dict: adding a command is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "build-store": ("tokenswap.store.build", "build or resume an image store + swap dataset from a YAML config"),
    "build-bench": ("tokenswap.eval.bench_builder", "build a TokenSwap-Bench-format dataset with the three filters"),
    "eval": ("tokenswap.eval.cli", "measure the modality gap of a model on a bench (loglik or generate)"),
    "compare": ("tokenswap.compare", "compare paired runs: markdown table, plot, optional W&B report"),
    "crossmath": ("tokenswap.crossmath.cli", "CrossMath puzzles: generate | eval"),
    "rest": ("tokenswap.rest.cli", "REST/REST+ render-equivalence suite: build | eval"),
    "probe": ("tokenswap.rest.probe", "per-layer image/text representation similarity of a model"),
}


def _usage() -> str:
    lines = ["usage: tokenswap <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `tokenswap <command> --help` for the options of one command."]
    return "\n".join(lines)


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
    return int(module.cli_main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
