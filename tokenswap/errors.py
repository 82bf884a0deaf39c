"""The errors every room raises for what a user must fix, so that one place (``tokenswap.cli.main``) maps them.

* :class:`InputError`: an input file, folder, flag or field a command cannot use; the message names it and the
  fix. ``tokenswap`` prints it as one line and exits with status 2, before any work where it can.
* :class:`IncompleteRunError`: the work ran but some of it could not be done (requests that failed for good
  beyond the allowed share); what was done is kept and the same command resumes. Exit status 1.
* :class:`BusyError`: another process holds what the command needs (an output folder's lock); nothing was done,
  the same command works once the holder is gone. Exit status 1.

This module imports nothing of tokenswap: it is the ground floor every other room may use.
"""

from __future__ import annotations

__all__ = ["BusyError", "IncompleteRunError", "InputError"]


class InputError(ValueError):
    """An input file, folder or flag a command cannot use; the message names it and the fix (exit status 2)."""


class IncompleteRunError(RuntimeError):
    """A run that finished without doing all of its work; what was done is kept, a rerun resumes (exit status 1)."""


class BusyError(RuntimeError):
    """Another process holds what this command needs (a folder's lock); the message names it (exit status 1)."""
