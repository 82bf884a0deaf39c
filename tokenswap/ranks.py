"""Which process this is, read from the launcher's environment, and printing from the main one only.

``accelerate launch`` and ``torchrun`` set ``RANK`` and ``WORLD_SIZE`` before any process group exists; the store
build synchronises through files and never makes one, and a bare ``PartialState()`` on CPU reports every process
as rank 0 of 1, so the environment is the one answer every room can use. This is the one module that reads
``RANK`` / ``WORLD_SIZE`` (``tests/tokenswap/test_ranks.py`` holds every other to it). Imports nothing of tokenswap.
"""

from __future__ import annotations

import os

__all__ = ["local_rank", "print0", "rank_and_world"]


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes (``0, 1`` outside a launcher)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """This process's rank on its own machine (its GPU's index); ``0`` outside a launcher."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def print0(*args, **kwargs) -> None:
    """``print`` on the main process only (flushed: the line must not wait for a buffer on a long run)."""
    if rank_and_world()[0] == 0:
        print(*args, **kwargs, flush=True)
