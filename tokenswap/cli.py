"""The ``tokenswap`` command.

Each subcommand lives next to the code it drives and exposes ``cli_main(argv) -> int``; this file routes, and
maps the errors every subcommand may raise to one line and an exit status with
:func:`tokenswap.errors.exit_status` (the recipes' entry, ``tokenswap.training.run_recipe``, uses the same one):

* :class:`~tokenswap.errors.InputError` (a file, folder, flag or field the command cannot use; the evaluators'
  backend errors and the leaderboard's input errors are ones) and a missing file: exit status 2, before any work
  where the check can be made early;
* :class:`~tokenswap.errors.IncompleteRunError` (more requests failed for good than ``--max-error-share`` allows;
  what was done is kept and the same command resumes) and :class:`~tokenswap.errors.BusyError` (another process
  holds the output folder): exit status 1.

The checks themselves live low in the package (:mod:`tokenswap.inputs`, :mod:`tokenswap.files`), so every room
can use them without importing this one. Imports are deferred so ``tokenswap --help`` stays instant.
"""

from __future__ import annotations

import importlib
import sys

from tokenswap.errors import OutputClosedError, exit_status

# subcommand -> (module, one-line help). A plain dict: adding a command is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "build-store": ("tokenswap.store.build", "build or resume an image store + swap dataset from a YAML config"),
    "build-bench": ("tokenswap.eval.bench_builder", "build a TokenSwap-Bench-format dataset with the three filters"),
    "eval": ("tokenswap.eval.cli", "measure the modality gap of a model on a bench (loglik or generate)"),
    "compare": ("tokenswap.compare", "compare paired runs: markdown table, plot, optional W&B report"),
    "leaderboard": ("tokenswap.eval.leaderboard", "many eval runs -> one gap table + figure (bootstrap CIs, group t-test)"),
    "crossmath": ("tokenswap.crossmath.cli", "CrossMath puzzles: generate | eval | fidelity (against the release)"),
    "rest": ("tokenswap.rest.cli", "REST/REST+ render-equivalence suite: build | eval"),
    "probe": ("tokenswap.rest.probe", "per-layer image/text representation similarity of a model"),
}


def _usage() -> str:
    lines = ["usage: tokenswap <command> [options]", "       tokenswap --version", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `tokenswap <command> --help` for the options of one command.",
              "Training runs from the recipes in the repository's recipes/ folder, not from this command:",
              "  python -m tokenswap.testing .cache                          (once: the tiny kit the tiny configs use)",
              "  python recipes/post_train.py --config tiny/post_text.yaml   (also pretrain.py, image_sft.py, grpo.py;",
              "  `python recipes/post_train.py --help` lists every config field)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from tokenswap.redaction import redacting_std_streams
    from tokenswap.script import redacting_excepthook

    # Every line a command prints (its messages, progress, warnings, --help) goes out with known secrets masked,
    # and so does the traceback of a bug, which the interpreter prints after the streams are restored; the caller's
    # excepthook comes back when the command ends. A reader gone before the usage is printed
    # (`tokenswap --help | true`) is a quiet 141, as for any command.
    with redacting_excepthook(), redacting_std_streams():
        return exit_status(lambda: _route(argv))


def _route(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from tokenswap import __version__

        print(f"tokenswap {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        try:
            print(f"tokenswap: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        except OutputClosedError as e:  # the line is lost, not the status: the command was still unknown
            e.silence()
        return 2
    return _run(name, rest)


def _run(name: str, rest: list[str]) -> int:
    from tokenswap.extras import COMMAND_EXTRAS, exit_on_missing_extra

    def run() -> int:
        from tokenswap.errors import InputError
        from tokenswap.redaction import command_line_secret

        why = command_line_secret(rest)  # before the command's imports: nothing of it runs
        if why is not None:
            raise InputError(why)
        # The import inside the mapping: Ctrl-C during a slow import is one line and 130 as well.
        return importlib.import_module(COMMANDS[name][0]).cli_main(rest)

    # A package of a job's extra not installed: one line naming the extra, exit status 2 (tokenswap.extras).
    verb = rest[:1] if name in ("crossmath", "rest") and rest and not rest[0].startswith("-") else []
    return exit_on_missing_extra(lambda: exit_status(run, prefix=f"tokenswap {name}: "),
                                 " ".join(["tokenswap", name, *verb]), COMMAND_EXTRAS.get(name))


if __name__ == "__main__":
    sys.exit(main())
