"""How a tokenswap process ends: the one place, with ``tokenswap.cli``'s console entry, that exits.

``run_script(main)`` is the whole ``__main__`` block of a recipe (through
:func:`tokenswap.training.entry.run_recipe`), of ``examples/demo.py`` and of ``python -m tokenswap.testing``:
``main`` runs inside the redacting output streams, the errors a user acts on become one line and an exit status by
:func:`tokenswap.errors.exit_status` (the mapping ``tokenswap.cli.main`` uses), and a traceback of anything else
(a bug) goes out masked as well, since the interpreter prints it after the streams are restored.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from tokenswap.errors import exit_status
from tokenswap.redaction import RedactingStream, redacting_std_streams

__all__ = ["install_redacting_excepthook", "run_script"]


def _print_masked(kind, value, tb) -> None:
    stream = RedactingStream(sys.stderr)
    traceback.print_exception(kind, value, tb, file=stream)
    stream.flush()


def install_redacting_excepthook() -> None:
    """Print an uncaught exception's traceback with known secrets masked (it is printed after every ``with``
    around ``main`` has ended, so the redacting streams no longer stand in front of stderr)."""
    sys.excepthook = _print_masked


def run_script(main: Callable[[], int | None], prefix: str = "") -> NoReturn:
    """Run ``main()`` as a script's whole life and end the process with its exit status.

    ``prefix`` names the command in the error line (``"tokenswap eval: "``; recipes print the bare ``error: ...``).
    The status is raised as ``SystemExit`` so that each rank of a launch ends with it and the launcher ends the run.
    """
    install_redacting_excepthook()
    with redacting_std_streams():
        code = exit_status(main, prefix=prefix)
    raise SystemExit(code)
