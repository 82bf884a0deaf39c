"""How the ranks of a store build share one folder: file barriers and the build's folder lock.

The build runs under ``accelerate launch`` or ``torchrun`` without a process group (it needs no
collective, and a rank killed mid-build must not hang the others in one): ranks come from the
launcher's ``RANK``/``WORLD_SIZE`` and wait for each other's ``done`` marker files, which also
record what a resumed build can skip. ``torch.distributed.barrier`` would need a process group and
would forget, on a restart, which ranks had finished.
"""

from __future__ import annotations

import time
from pathlib import Path

from tokenswap.errors import IncompleteRunError
from tokenswap.files import FolderLock, FolderLockedError


class OtherRankFailed(IncompleteRunError):
    """Another rank of this launch stopped a stage on failed requests; this rank stops too (a rerun resumes all)."""


def wait_for(
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


class BuildLockedError(FolderLockedError):
    """Another build is running on the same output folder (``tokenswap`` exits with status 1)."""


def build_lock(out: Path, rank: int) -> FolderLock:
    """The build's lock on ``<out>/.build-lock-rRRR``: a second build on the folder is refused, naming the holder."""
    return FolderLock(out, rank, prefix=".build-lock", doing="being built", error=BuildLockedError, what="build")
