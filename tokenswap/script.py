"""How a tokenswap process ends: the one place, with ``tokenswap.cli``'s console entry, that exits.

``run_script(main)`` is the whole ``__main__`` block of a recipe (through
:func:`tokenswap.training.entry.run_recipe`), of ``examples/demo.py`` and of ``python -m tokenswap.testing``:
``main`` runs inside the redacting output streams, the errors a user acts on become one line and an exit status by
:func:`tokenswap.errors.exit_status` (the mapping ``tokenswap.cli.main`` uses), and a traceback of anything else
(a bug) goes out masked as well, since the interpreter prints it after the streams are restored.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import NoReturn

from tokenswap.errors import OutputClosedError, exit_status
from tokenswap.extras import missing_extra
from tokenswap.redaction import RedactingStream, command_line_secret, redacting_std_streams, script_streams

__all__ = ["CommandParser", "install_redacting_excepthook", "redacting_excepthook", "require_extra", "run_script",
           "start_script"]


class CommandParser(argparse.ArgumentParser):
    """The commands' ``argparse.ArgumentParser``: a usage error is status 2 even when its lines cannot be written.

    argparse prints the usage and the error to stderr before it exits 2; with the reader of stderr gone, that
    print raised :class:`~tokenswap.errors.OutputClosedError` and the command ended 141, as if it had been cut off
    mid-work. Only the line is lost: the status still says the arguments were wrong, as every other error's does.
    """

    def error(self, message: str) -> NoReturn:
        try:
            super().error(message)
        except OutputClosedError as e:
            e.silence()
            raise SystemExit(2) from None


def _print_masked(kind, value, tb) -> None:
    stream = RedactingStream(sys.stderr)
    traceback.print_exception(kind, value, tb, file=stream)
    stream.flush()


def install_redacting_excepthook() -> None:
    """Print an uncaught exception's traceback with known secrets masked (it is printed after every ``with``
    around ``main`` has ended, so the redacting streams no longer stand in front of stderr). For a process's whole
    life (a script); a call that returns uses :func:`redacting_excepthook`."""
    sys.excepthook = _print_masked


@contextlib.contextmanager
def redacting_excepthook() -> Iterator[None]:
    """The redacting excepthook for one command, the caller's hook back when it ends.

    A command that returns (any exit status) restores the hook at once. A bug escaping the command is printed by the
    interpreter only later, after this block: the masking hook stays for that one traceback and then gives the
    caller's hook back itself, so an interpreter, a notebook or a test calling ``tokenswap.cli.main`` keeps its own.
    """
    previous = sys.excepthook

    def once(kind, value, tb) -> None:
        if sys.excepthook is once:
            sys.excepthook = previous
        _print_masked(kind, value, tb)

    sys.excepthook = once
    try:
        yield
    except BaseException as e:
        if isinstance(e, SystemExit) and sys.excepthook is once:
            sys.excepthook = previous  # an exit status, not a traceback
        raise
    else:
        if sys.excepthook is once:
            sys.excepthook = previous


def run_script(main: Callable[[], int | None], prefix: str = "") -> NoReturn:
    """Run ``main()`` as a script's whole life and end the process with its exit status.

    ``prefix`` names the command in the error line (``"tokenswap eval: "``; recipes print the bare ``error: ...``).
    The status is raised as ``SystemExit`` so that each rank of a launch ends with it and the launcher ends the run.
    """
    install_redacting_excepthook()
    with redacting_std_streams():
        code = exit_status(main, prefix=prefix)
    raise SystemExit(code)


def start_script() -> None:
    """What a script run as a process needs before its other imports run (``import tokenswap.start``, the recipes'
    first line): the redacting streams in front of stdout/stderr for the rest of the process (what the imports print
    and the log handlers they make go out masked, in whole lines, and a reader gone during them costs no traceback),
    and a secret on the command line refused: one line ``error: ...`` naming the variable to set instead, exit 2,
    before seconds of imports, the value never printed."""
    script_streams()
    why = command_line_secret(sys.argv[1:])
    if why is None:
        return
    try:
        print(f"error: {why}", file=sys.stderr, flush=True)
    except OutputClosedError as e:  # no one reads the line: the status still says it
        e.silence()
    raise SystemExit(2)


def require_extra(extra: str, command: str) -> None:
    """End the process with one line and exit status 2 unless every package of ``extra`` is installed (the top of
    a training recipe: ``require_extra("train", "recipes/post_train.py")``)."""
    line = missing_extra(extra, command)
    if line is None:
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except OutputClosedError as e:  # no one reads the line: the status still says it
        e.silence()
    raise SystemExit(2)
