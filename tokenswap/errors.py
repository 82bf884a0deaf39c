"""The errors every room raises for what a user must fix, and the one mapping of them to a line and an exit status.

* :class:`InputError`: an input file, folder, flag or field a command cannot use; the message names it and the
  fix. ``tokenswap`` prints it as one line and exits with status 2, before any work where it can.
* :class:`IncompleteRunError`: the work ran but some of it could not be done (requests that failed for good
  beyond the allowed share, a training run whose steps had nothing to learn, a save that failed); what was done is
  kept and the same command resumes. Exit status 1.
* :class:`BusyError`: another process holds what the command needs (an output folder's lock); nothing was done,
  the same command works once the holder is gone. Exit status 1.
* :class:`PreemptedError`: a training run stopped by SIGTERM after saving a complete checkpoint; relaunching the
  same command continues it. Exit status :data:`PREEMPTED_EXIT` (143).
* :class:`OutputClosedError`: the reader of the command's output went away (``tokenswap leaderboard ... | head``);
  the command ends quietly, as a shell tool killed by SIGPIPE does. Exit status :data:`OUTPUT_CLOSED_EXIT` (141).

:func:`exit_status` is the mapping, the one place an error becomes an exit status: ``tokenswap.cli.main`` runs
every subcommand through it and ``tokenswap.training.run_recipe`` every recipe, each inside the redacting output
streams of :mod:`tokenswap.redaction`. Every room raises; no room prints ``error:`` or exits by itself.

This module imports nothing of tokenswap: it is the ground floor every other room may use.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from collections.abc import Callable

__all__ = ["INTERRUPTED_EXIT", "OUTPUT_CLOSED_EXIT", "PREEMPTED_EXIT", "BusyError", "IncompleteRunError", "InputError",
           "OutputClosedError", "PreemptedError", "disk_error_message", "exit_status", "free_space",
           "interrupted_message"]

PREEMPTED_EXIT = 143
"""Exit status after a SIGTERM stop (128 + 15, what a process killed by SIGTERM reports): the run saved a complete
checkpoint and did not finish, so a scheduler that requeues on failure relaunches it, and nothing downstream reads
the folder as a finished run."""

OUTPUT_CLOSED_EXIT = 141
"""Exit status when the reader of the output went away (128 + 13, what a shell reports for a process killed by
SIGPIPE, as ``yes | head`` leaves ``yes``): nothing went wrong in the command, and a pipeline under ``pipefail``
still sees that it did not finish."""


class InputError(ValueError):
    """An input file, folder or flag a command cannot use; the message names it and the fix (exit status 2)."""


class IncompleteRunError(RuntimeError):
    """A run that finished without doing all of its work; what was done is kept, a rerun resumes (exit status 1)."""


class BusyError(RuntimeError):
    """Another process holds what this command needs (a folder's lock); the message names it (exit status 1)."""


class PreemptedError(RuntimeError):
    """A run stopped by SIGTERM with a complete checkpoint saved (exit status :data:`PREEMPTED_EXIT`).

    Not an error of the user's: the run's main process has already said where it stopped and how to continue (on
    stdout, where a run's progress goes), so :func:`exit_status` prints nothing more for it.
    """


class OutputClosedError(BaseException):
    """The reader of a command's stdout or stderr closed its end (``| head``), raised by the redacting streams
    (:class:`tokenswap.redaction.RedactingStream`) in place of the ``BrokenPipeError`` of their write, so that a broken
    pipe to a server (a ``BrokenPipeError`` too) is never mistaken for it. ``fd`` is the stream's file descriptor
    (``None`` where it has none).

    A ``BaseException``, as ``KeyboardInterrupt`` is, and no ``OSError``: the command stops wherever it was, and no
    ``except OSError`` around printing code (a save-failure handler) and no ``except Exception`` (logging's
    ``handleError``, which would print "--- Logging error ---" and go on) takes it for a fault of its own."""

    def __init__(self, *args, fd: int | None = None):
        super().__init__(*args)
        self.fd = fd

    def silence(self) -> None:
        """Send the closed descriptor to /dev/null: what is still buffered for it goes nowhere at the interpreter's
        last flush, instead of an "Exception ignored ... BrokenPipeError" on stderr."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.fd)


INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C (128 + 2, what a shell reports for a process killed by SIGINT)."""

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def interrupted_message() -> str:
    """The one line of a command or recipe stopped by Ctrl-C: every tokenswap output is written whole (atomic
    files, whole JSONL lines), so what was written is kept and the same command resumes from it."""
    return ("interrupted (Ctrl-C): every file and answer written so far is kept whole; run the same command again "
            "to resume from them")


def free_space(path: str | os.PathLike) -> str:
    """``"disk of <folder>: N MiB free"`` for the disk holding ``path`` (its nearest existing folder)."""
    folder = os.path.realpath(path)
    while folder != os.path.dirname(folder) and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return f"disk of {folder}: {free}"


def _written_file(e: OSError) -> str | None:
    """The file a failed write was writing: the error's own, else the innermost frame's open file or path."""
    if e.filename is not None:
        return os.fsdecode(e.filename)
    tb, found = e.__traceback__, None
    while tb is not None:
        for name in ("path", "tmp", "f", "file", "filename"):
            value = tb.tb_frame.f_locals.get(name)
            if not isinstance(value, (str, os.PathLike)):  # an open file: its path (a Path's .name is no path)
                value = getattr(value, "name", None)
            if isinstance(value, (str, os.PathLike)) and os.fspath(value):
                found = os.fspath(value)
                break
        tb = tb.tb_next
    return found


def disk_error_message(e: OSError) -> str | None:
    """One line for a write a full disk (ENOSPC, EDQUOT) or a read-only place (EROFS, EACCES, EPERM) refused,
    naming the file and, for a full disk, the disk and its free space (as a failed checkpoint save does);
    ``None`` for any other error."""
    if e.errno not in _DISK_FULL + _NOT_WRITABLE:
        return None
    file = _written_file(e)
    if e.errno in _NOT_WRITABLE:
        if file is None:
            return None
        return (f"cannot use {file!r} ({e.strerror}): a read-only disk or no permission; pick a folder you can "
                "write to (or fix its permissions)")
    where = free_space(file if file is not None else os.getcwd())
    return (f"writing {file or 'an output file'!r} failed: [Errno {e.errno}] {e.strerror} ({where}). What was "
            "written before is kept whole: free space on that disk (or pick a folder on a larger one), then run the "
            "same command again to resume")


def exit_status(run: Callable[[], int | None], prefix: str = "") -> int:
    """``run()``'s exit status (``None`` is 0), with the errors a user acts on mapped to one line on stderr.

    The line is ``{prefix}error: {message}`` (``prefix`` names the command: ``"tokenswap eval: "``; the recipes
    print the bare ``error: ...``). :class:`InputError`, a missing file or folder, and a local model path that does
    not exist are 2; :class:`IncompleteRunError` and :class:`BusyError` are 1; :class:`PreemptedError` is
    :data:`PREEMPTED_EXIT`; :class:`OutputClosedError` is :data:`OUTPUT_CLOSED_EXIT`, with nothing printed.
    Ctrl-C is :data:`INTERRUPTED_EXIT` with one line (what is kept, how to resume); a write refused by a full disk
    is 1 and by a read-only place 2, one line naming the file (:func:`disk_error_message`).
    Anything else propagates (a bug is a traceback). The caller installs the redacting streams around this call, so
    the line goes out with known secrets masked.
    """
    def say(message: str) -> None:
        try:
            print(f"{prefix}error: {message}", file=sys.stderr, flush=True)
        except OutputClosedError as e:  # no one reads the line: the status still tells what happened
            e.silence()

    try:
        return int(run() or 0)
    except InputError as e:
        say(str(e))
        return 2
    except (IncompleteRunError, BusyError) as e:
        say(str(e))
        return 1
    except PreemptedError:
        try:
            sys.stdout.flush()
        except OutputClosedError as e:  # the stop is done and its checkpoint saved: 143 all the same
            e.silence()
        return PREEMPTED_EXIT
    except OutputClosedError as e:  # nothing to say, and nowhere to say it
        e.silence()
        return OUTPUT_CLOSED_EXIT
    except FileExistsError as e:  # an output folder's path taken by a file, found where a command makes the folder
        say(f"{e.filename!r} exists and is not a folder; pass a folder path (or move the file away)")
        return 2
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
        say(e.args[-1] if e.filename is None else f"{e.strerror}: {e.filename!r}")
        return 2
    except KeyboardInterrupt as e:  # a room that knows better what is kept says it in the interrupt's message
        say(str(e) if e.args else interrupted_message())
        return INTERRUPTED_EXIT
    except OSError as e:
        if (message := disk_error_message(e)) is not None:
            say(message)
            return 2 if e.errno in _NOT_WRITABLE else 1
        # transformers/huggingface_hub report a missing local checkpoint as an invalid repo id.
        if "Repo id must be" not in str(e):
            raise
        say(f"a model or dataset path does not exist locally and is not a hub id ({str(e).splitlines()[0]})")
        return 2
