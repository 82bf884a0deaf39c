"""How the ranks of a store build share one folder: launcher ranks, file barriers, a folder lock.

The build runs under ``accelerate launch`` or ``torchrun`` without a process group (it needs no
collective, and a rank killed mid-build must not hang the others in one): ranks come from the
launcher's ``RANK``/``WORLD_SIZE`` and wait for each other's ``done`` marker files, which also
record what a resumed build can skip. ``torch.distributed.barrier`` would need a process group and
would forget, on a restart, which ranks had finished.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes (1 outside a launcher).

    Read from the launcher's environment (``accelerate launch`` and ``torchrun`` set RANK and
    WORLD_SIZE): the build synchronises through marker files and needs no process group, and a
    bare ``PartialState()`` on CPU reports every process as rank 0 of 1.
    """
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class OtherRankFailed(RuntimeError):
    """Another rank of this launch stopped a stage on failed requests; this rank stops too (a rerun resumes all)."""


def _wait_for(
    paths: list[Path], what: str, timeout_s: float, abort_if: list[Path] = (), since: float = 0.0
) -> None:
    """Wait until every path exists; raise OtherRankFailed at once if one of ``abort_if`` is written after ``since``.

    ``since`` (a ``time.time()``) is this launch's start, so a failure marker a previous run left behind
    (its rank deletes it when it starts the stage again) does not stop this one.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [p for p in paths if not p.exists()]
        if not missing:
            return
        for marker in abort_if:
            try:
                fresh = marker.stat().st_mtime >= since
            except FileNotFoundError:
                continue
            if fresh:
                raise OtherRankFailed(f"another rank stopped {what} on failed requests ({marker}); see report.json")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout_s:.0f}s for other ranks to finish {what}; missing {[str(p) for p in missing][:4]}. "
                "Did a rank crash? Relaunch the same command to resume."
            )
        time.sleep(0.2)


class BuildLockedError(RuntimeError):
    """Another build is running on the same output folder."""


class _FolderLock:
    """An exclusive ``flock`` on ``<output_dir>/.build-lock-rRRR``, held for the whole build.

    The kernel drops the lock when its process exits, however it exits, so a SIGKILLed build
    never leaves a stale lock behind. Each rank locks its own file: the ranks of one launch never
    wait on each other, while a second build on the folder collides with the first on rank 0's
    file (or, for a second launch of N ranks, on every rank's file). The holder's PID, host and
    start time are written into the file so the refused build can say who holds it. Works on
    local disks and on NFS (Linux emulates flock with POSIX locks there).
    """

    def __init__(self, out: Path, rank: int, *, prefix: str = ".build-lock", doing: str = "being built",
                 error: type[RuntimeError] = BuildLockedError, what: str = "build"):
        # prefix/doing/error/what: the same lock for a training run's output folder (tokenswap.training.run_folder).
        self.path = out / f"{prefix}-r{rank:03d}"
        self._doing, self._error, self._what = doing, error, what
        self._fd: int | None = None

    def __enter__(self) -> _FolderLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown process"
            os.close(fd)
            raise self._error(
                f"{self.path.parent} is {self._doing} by another process ({holder}); wait for it to finish "
                f"(a killed {self._what} releases the folder at once), or use another output_dir"
            ) from None
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} since {stamp}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
