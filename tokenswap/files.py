"""File-system primitives every room uses: atomic writes, a folder lock, and checked JSON / JSONL readers.

* :func:`atomic_write`: readers see the old file or the whole new one, never a part. Each writer has its own
  temporary file (host, process and thread in its name); a writer that fails (a full disk) removes it, and the
  temporaries a killed writer left are removed by the next write of the same file and by
  :func:`remove_dead_temporaries`, which long jobs call on their folder when they start.
* :class:`FolderLock`: one job per output folder, an exclusive ``flock`` released by the kernel when its holder
  dies. Processes forked while it is held (data-loader workers) drop their copy at once, so a killed holder
  frees the folder at once, not when its orphaned workers notice. The lock file is never followed as a symlink,
  and it holds its holder's tag from the first instant (a locked, tagged temporary hard-linked into place; on a
  disk without hard links, the file is locked in place and tagged right after).
* :func:`read_json` / :func:`iter_jsonl` / :func:`read_jsonl` / :func:`json_loads`: a missing, unreadable, empty,
  truncated or hostile file (nesting Python's parser cannot take, integers past its digit limit) is an
  :class:`InputError` naming the file (and ``path:line``) and the fix, not a traceback. :func:`iter_jsonl` is the
  one JSONL reader of user and build files: the data loaders, the store build, CrossMath, REST and the
  leaderboard all read through it.

Only :mod:`tokenswap.errors` is imported: this is the ground floor.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tokenswap.errors import BusyError, InputError

__all__ = [
    "FolderLock",
    "FolderLockedError",
    "atomic_write",
    "atomic_write_figure",
    "atomic_write_image",
    "atomic_write_json",
    "atomic_write_text",
    "cut_torn_tail",
    "json_loads",
    "glob_escape",
    "iter_jsonl",
    "read_json",
    "read_json_object",
    "read_jsonl",
    "remove_dead_temporaries",
]

_HOST = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()
# name.PID-TID-HOST.tmp (the host part is absent in files written before it was added).
_TEMPORARY = re.compile(r"^(?P<target>.+)\.(?P<pid>\d+)-(?P<tid>\d+)(?:-(?P<host>[0-9a-f]{8}))?\.tmp$")


# ----------------------------------------------------------------------------- atomic writes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _dead_temporary(path: Path, target: str | None = None) -> bool:
    m = _TEMPORARY.match(path.name)
    if m is None or (target is not None and m["target"] != target):
        return False
    # A temporary of another host (a shared disk) cannot be judged from here: it is left alone.
    return m["host"] in (None, _HOST) and int(m["pid"]) != os.getpid() and not _alive(int(m["pid"]))


def remove_dead_temporaries(folder: str | os.PathLike, recursive: bool = True) -> list[Path]:
    """Delete the :func:`atomic_write` temporaries under ``folder`` whose writer is no longer alive on this host.

    Returns:
        The files removed. A live writer's temporary, and any file not named like one, is kept.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    removed = []
    for path in root.rglob("*.tmp") if recursive else root.glob("*.tmp"):
        if path.is_file() and _dead_temporary(path):
            try:
                path.unlink()
            except FileNotFoundError:  # another process cleaned it first
                continue
            removed.append(path)
    return removed


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    The temporary file is the writer's own (host, process and thread in its name): two ranks writing
    ``store.json`` at once each rename a whole file (the last one wins) instead of one renaming the other's away.
    A failed write (``ENOSPC``) removes its temporary before raising; a killed writer's temporary of the same file
    is removed here the next time the file is written.
    """
    path = Path(path)
    for stale in path.parent.glob(f"{glob_escape(path.name)}.*.tmp"):
        if _dead_temporary(stale, path.name):
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}-{_HOST}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: str | os.PathLike, text: str, errors: str = "strict") -> None:
    """:func:`atomic_write` of ``text`` as UTF-8 (``errors`` as :meth:`str.encode` takes it)."""
    atomic_write(path, text.encode("utf-8", errors))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, ensure_ascii: bool = True,
                      newline: bool = False, **dumps_kw) -> None:
    """:func:`atomic_write` of ``json.dumps(obj, indent=..., ...)`` (a final newline when ``newline``)."""
    text = json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii, **dumps_kw)
    atomic_write_text(path, text + "\n" if newline else text)


def atomic_write_figure(path: str | os.PathLike, figure, **savefig_kw) -> None:
    """:func:`atomic_write` of a matplotlib ``Figure``, in the format ``path``'s suffix names (``savefig``'s rule).

    The figure is drawn on an Agg canvas of its own: no backend is chosen for the process (a notebook keeps its
    inline figures) and pyplot never holds the figure.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buf = io.BytesIO()
    figure.savefig(buf, format=Path(path).suffix.lstrip(".").lower() or "png", **savefig_kw)
    atomic_write(path, buf.getvalue())


def atomic_write_image(path: str | os.PathLike, image, format: str | None = None, **save_kw) -> None:
    """:func:`atomic_write` of a PIL image, in ``format`` or the one ``path``'s suffix names (PIL's rule)."""
    buf = io.BytesIO()
    suffix = Path(path).suffix.lstrip(".").upper()
    image.save(buf, format=format or {"JPG": "JPEG"}.get(suffix, suffix or "PNG"), **save_kw)
    atomic_write(path, buf.getvalue())


def glob_escape(name: str) -> str:
    """``name`` with the glob metacharacters ``* ? [`` made literal."""
    return re.sub(r"([*?\[])", r"[\1]", name)


# ----------------------------------------------------------------------------- the folder lock


class FolderLockedError(BusyError):
    """Another process holds the folder's lock; the message names its PID, host and start time."""


# Descriptors of the locks this process holds: a forked child closes its copies at once (see FolderLock).
_HELD_FDS: set[int] = set()


def _drop_inherited_locks() -> None:
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


# How long a refused job waits for a held lock's tag to name a live holder before saying "unknown process": the
# tag is in the file before the lock is, so only a file written by an older tokenswap, or one being taken over from
# a dead holder, is read without it, and either settles within microseconds.
_TAG_WAIT_S = 2.0
# link(2)'s answers on a disk without hard links (exFAT, FUSE, some SMB mounts), where the lock falls back to
# create-and-flock with the tag written after.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV})
_TAG = re.compile(r"^pid (?P<pid>\d+) on host (?P<host>\S+) since ")


def _command() -> str:
    """The program and its subcommand (``tokenswap build-store``): the rest of a command line may hold a secret
    (``judge.api_key=...``), and the tag is written into the output folder."""
    words = [os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"]
    if len(sys.argv) > 1 and re.fullmatch(r"[A-Za-z][\w.-]*", sys.argv[1]):
        words.append(sys.argv[1])
    return " ".join(words)


class FolderLock:
    """An exclusive ``flock`` on ``<folder>/<prefix>-rRRR``, held until :meth:`release` (or the process ends).

    The kernel drops the lock when the last descriptor of its open file goes, however the holder exits, so a
    SIGKILLed job never leaves a stale lock behind. A forked child (a data-loader worker) would share that open
    file and keep the lock alive until it exits: every child closes its copy right after the fork. Each rank locks
    its own file: the ranks of one launch never wait on each other, while a second job on the folder collides with
    the first on rank 0's file. Works on local disks and on NFS (Linux emulates flock with POSIX locks there).

    The holder's tag (PID, host, start time, command) is in the file from the first instant the lock is: the tag
    is written into a temporary file, which is locked and then hard-linked into place (``link`` fails if the lock
    file exists, so two jobs cannot both succeed). A lock file left by a dead holder is taken over by locking it
    (nobody holds it) and renaming the new tagged, locked file over it; a refused job checks that the file it
    read is still the one in place and that its tag names a live process, and looks again for a bounded moment
    otherwise. :meth:`release` removes the file before unlocking it, so a file left behind is a dead holder's.
    Where the disk refuses hard links (``link`` answers EPERM, ENOTSUP, ENOSYS or EXDEV: exFAT, many FUSE and SMB
    mounts), the lock file is created (or opened) and ``flock``ed in place and the tag written right after; a job
    refused in between waits (bounded) for the tag, so the holder is still named.

    Args:
        folder: the folder to lock (created if missing).
        rank: this process's rank (its own lock file).
        prefix: the lock file's name before ``-rRRR``.
        doing: what the holder does, for the message (``"being built"``).
        error: the exception raised when another process holds the lock.
        what: the kind of job, for the message (``"build"``).

    Raises:
        error: another process holds the lock.
        InputError: the lock file cannot be one: a read-only disk, a folder or a symlink in its place.
    """

    def __init__(self, folder: str | os.PathLike, rank: int = 0, *, prefix: str = ".lock", doing: str = "in use",
                 error: type[RuntimeError] = FolderLockedError, what: str = "job"):
        self.path = Path(folder) / f"{prefix}-r{rank:03d}"
        self._doing, self._error, self._what = doing, error, what
        self._fd: int | None = None

    def _unusable(self, e: OSError) -> InputError | None:
        if e.errno == errno.ELOOP:
            return InputError(
                f"{self.path} is a symbolic link; tokenswap does not follow it (its target would be overwritten): "
                "remove the link and rerun"
            )
        if e.errno == errno.EISDIR:
            return InputError(f"{self.path} is a folder where the lock file goes; remove it and rerun")
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return InputError(
                f"cannot create the lock file {self.path} ({e.strerror}): the folder must be writable; pick an "
                "output folder on a writable disk"
            )
        return None

    def _tagged(self) -> tuple[int, Path]:
        """A new file holding this process's tag, locked by it: what the lock file becomes when it is taken."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tag = f"pid {os.getpid()} on host {socket.gethostname()} since {stamp}, running {_command()}\n"
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}-{threading.get_ident()}-{_HOST}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise (self._unusable(e) or e) from None
        _HELD_FDS.add(fd)  # a fork from another thread must not carry it off
        try:
            os.write(fd, tag.encode())
            os.fsync(fd)  # on NFS another client reads the tag as soon as the link is there
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and unnamed: nobody else can hold it
        except BaseException:
            self._close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd, tmp

    def _in_place(self, fd: int) -> bool:
        """Whether ``fd`` is the file now at :attr:`path` (not one a taker has renamed over, or a released one)."""
        try:
            here = os.lstat(self.path)
        except FileNotFoundError:
            return False
        there = os.fstat(fd)
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def _holder(self, fd: int) -> tuple[str, bool]:
        """The tag of the held file ``fd`` and whether it can be believed: it is the file in place and names a
        live process (one of another host cannot be judged from here)."""
        tag = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
        m = _TAG.match(tag)
        if m is None or not self._in_place(fd):
            return tag, False
        return tag, m["host"] != socket.gethostname() or _alive(int(m["pid"]))

    @staticmethod
    def _close(fd: int) -> None:
        _HELD_FDS.discard(fd)
        os.close(fd)

    def acquire(self) -> FolderLock:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise InputError(
                f"cannot create the output folder {folder} ({e.strerror}): pick an output folder on a writable disk"
            ) from None
        for stale in folder.glob(f"{glob_escape(self.path.name)}.*.tmp"):  # a job killed while taking the lock
            if _dead_temporary(stale, self.path.name):
                stale.unlink(missing_ok=True)
        mine, tmp = self._tagged()
        try:
            held = self._take(mine, tmp)
        except BaseException:
            self._close(mine)
            tmp.unlink(missing_ok=True)
            raise
        if held != mine:  # the disk has no hard links: the lock is the file in place, tagged after its flock
            self._close(mine)
        tmp.unlink(missing_ok=True)  # linked into place (or renamed there): the lock file is its other name
        self._fd = held
        return self

    def _take(self, mine: int, tmp: Path) -> int:
        """The descriptor that holds the lock: ``mine`` (the tagged temporary, now in place), or one of the file in
        place when the disk refuses hard links (:meth:`_take_in_place`)."""
        deadline = time.monotonic() + _TAG_WAIT_S
        while True:
            try:
                os.link(tmp, self.path)
                return mine
            except FileExistsError:
                pass
            except OSError as e:
                if e.errno in _NO_HARD_LINKS:
                    return self._take_in_place(mine, deadline)
                raise (self._unusable(e) or e) from None
            try:
                # O_NOFOLLOW: a symlink planted in the lock's place must not lead us to its target. Read-write: NFS
                # grants an exclusive lock only on a file open for writing.
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:  # released between the link and the open
                continue
            except OSError as e:
                raise (self._unusable(e) or e) from None
            _HELD_FDS.add(fd)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self._refuse_or_wait(fd, deadline)  # a takeover or a release in its last microseconds
                    continue
                if self._in_place(fd):
                    # A dead holder's file, now locked by us: nobody can replace it meanwhile, so ours goes in its
                    # place whole (tag and lock together).
                    os.rename(tmp, self.path)
                    return mine
            finally:
                self._close(fd)

    def _refuse_or_wait(self, fd: int, deadline: float) -> None:
        """Raise the refusal naming the holder of the held ``fd`` once its tag can be believed (or the bounded wait
        is over); return to look again otherwise."""
        tag, believed = self._holder(fd)
        if believed or time.monotonic() > deadline:
            raise self._error(
                f"{self.path.parent} is {self._doing} by another process ({tag or 'unknown process'}); "
                f"wait for it to finish (a killed {self._what} releases the folder at once), or use "
                "another output folder"
            ) from None
        time.sleep(0.005)

    def _take_in_place(self, mine: int, deadline: float) -> int:
        """The lock on a disk that refuses hard links (exFAT, many FUSE and SMB mounts): create-or-open the lock
        file, ``flock`` it, then write the tag. A job refused in the instant between the two waits (bounded) for
        the tag, so the holder is still named wherever the disk keeps the file."""
        tag = os.pread(mine, 512, 0)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise (self._unusable(e) or e) from None
            _HELD_FDS.add(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    self._refuse_or_wait(fd, deadline)
                finally:
                    self._close(fd)
                continue
            except BaseException:
                self._close(fd)
                raise
            if not self._in_place(fd):  # released (removed) between our open and our flock: take the new one
                self._close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, tag, 0)
                os.fsync(fd)
            except BaseException:
                self.path.unlink(missing_ok=True)
                self._close(fd)
                raise
            return fd

    def release(self) -> None:
        if self._fd is not None:
            # Removed while still held: a lock file left in a folder is then always a dead holder's.
            if self._in_place(self._fd):
                self.path.unlink(missing_ok=True)
            self._close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ----------------------------------------------------------------------------- checked readers


def json_loads(text: str | bytes) -> Any:
    """``json.loads`` whose every refusal is a ``ValueError``: also nesting deeper than Python's recursion limit
    (``RecursionError``) and integers past its digit limit (a plain ``ValueError`` that is no JSONDecodeError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


def _problem(e: ValueError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg.removesuffix(' at')} at line {e.lineno}, column {e.colno}"  # its msg may end in " at"
    return str(e).split(";")[0]


def read_json(path: str | os.PathLike, what: str, fix: str = "restore or regenerate it") -> Any:
    """The JSON value in ``path``; a missing, unreadable, non-UTF-8, empty, truncated or unparsable file is an
    :class:`InputError` naming the file, what it is and ``fix`` (``json``'s own error names no file)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise _unreadable(path, what, fix, e) from None
    if not raw.strip():
        raise InputError(f"{what} {str(path)!r} is empty; {fix}")
    try:
        return json_loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {str(path)!r} is not UTF-8 text (byte {e.start}); {fix}") from None
    except ValueError as e:
        raise InputError(f"{what} {str(path)!r} is not valid JSON ({_problem(e)}; truncated or overwritten?); "
                         f"{fix}") from None


def _unreadable(path: str | os.PathLike, what: str, fix: str, e: OSError) -> InputError:
    if isinstance(e, FileNotFoundError):
        return InputError(f"{what} {str(path)!r} does not exist; {fix}")
    if isinstance(e, IsADirectoryError):
        return InputError(f"{what} {str(path)!r} is a folder, not a file; {fix}")
    return InputError(f"{what} {str(path)!r} cannot be read ({e.strerror or e}); {fix}")


def read_json_object(path: str | os.PathLike, what: str, fix: str = "restore or regenerate it") -> dict:
    """:func:`read_json` of a file that must hold one JSON object."""
    value = read_json(path, what, fix)
    if not isinstance(value, dict):
        raise InputError(f"{what} {str(path)!r} holds a JSON {type(value).__name__}, not an object; {fix}")
    return value


def _line_problem(raw: bytes) -> tuple[dict | None, str | None]:
    """``(object, None)`` for a line holding a JSON object, else ``(None, what is wrong with it)``."""
    try:
        row = json_loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"is not UTF-8 text (byte {e.start} of the line)"
    except ValueError as e:
        return None, f"is not valid JSON ({_problem(e)}; a run killed mid-write?)"
    if not isinstance(row, dict):
        return None, f"holds a JSON {type(row).__name__}, not an object"
    return row, None


def iter_jsonl(path: str | os.PathLike, what: str, fix: str = "restore or regenerate it", *,
               parse: Callable[[dict], Any] | None = None, yield_malformed: bool = False) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each non-blank line of a JSONL file, read line by line (a file of any size streams);
    ``where`` is ``"path:line"``, the one way every message names a line.

    Every refusal is an :class:`InputError` naming the file (and ``path:line``) and ``fix``: a file that is
    missing or unreadable, a line that is not UTF-8, not valid JSON or no JSON object. ``parse`` turns each object
    into what is yielded (``RestItem.from_dict``); a ``ValueError`` it raises becomes an InputError naming
    ``path:line``, its message and ``fix``.

    Args:
        yield_malformed: a line that is no JSON object is yielded as ``(where, InputError)`` (its message names
            the line and what is wrong, without ``fix``) instead of raising, so a caller that skips and counts
            bad rows (``data.skip_malformed``) sees each one where it is; ``parse`` is not called on it.

    Lines end at ``\\n`` only: ``json.dumps(..., ensure_ascii=False)`` writes U+2028, U+0085 and the other
    characters ``str.splitlines`` also breaks at raw inside strings, so a record holding one is still one line.
    """
    try:
        f = open(path, "rb")  # opened apart from the `with`: only the open's own errors say the file is unreadable
    except OSError as e:
        raise _unreadable(path, what, fix, e) from None
    with f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            row, problem = _line_problem(raw.removesuffix(b"\n"))
            if problem is not None:
                if yield_malformed:
                    yield where, InputError(f"{what} {where} {problem}")
                    continue
                raise InputError(f"{what} {where} {problem}; {fix}")
            if parse is not None:
                try:
                    row = parse(row)
                except ValueError as e:
                    raise InputError(f"{what} {where}: {e}; {fix}") from None
            yield where, row


def read_jsonl(path: str | os.PathLike, what: str, fix: str = "restore or regenerate it",
               parse: Callable[[dict], Any] | None = None) -> list:
    """The rows of :func:`iter_jsonl` (refusing any bad line), as a list in file order."""
    return [row for _, row in iter_jsonl(path, what, fix, parse=parse)]


def cut_torn_tail(path: str | os.PathLike) -> int:
    """Cut the last line of an append-only JSONL file when a killed writer left it without its ``\\n``.

    A job that resumes by appending would otherwise glue its first record onto the torn one, and both would be
    lost (or the file unreadable). Every line before the tail was written whole (one ``write`` + flush each).

    Returns:
        The number of bytes cut (0 when the file is missing, empty or ends in a newline).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "r+b") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1
        f.truncate(keep)
    return size - keep
