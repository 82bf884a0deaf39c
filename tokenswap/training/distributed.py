"""Rank-aware helpers: agree across the ranks of a run, and end a multi-process run cleanly."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from tokenswap.ranks import print0

__all__ = ["any_rank", "at_script_end", "close_process_group", "end_script", "max_over_ranks", "print0"]


def max_over_ranks(value: int, args=None) -> int:
    """The largest ``value`` over the ranks (every rank returns the same answer); ``value`` itself in one process.

    Args:
        value: this rank's value (a flag as 0/1, an exit status).
        args: the run's ``TrainingArguments`` (its device carries the collective on NCCL).
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return value
    device = "cpu" if dist.get_backend() == "gloo" else (args.device if args is not None else "cuda")
    t = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool, args=None) -> bool:
    """``flag`` OR-ed over the ranks (every rank returns the same answer); the flag itself in one process."""
    return bool(max_over_ranks(int(flag), args))


_GLOO_RAN = False
_AT_SCRIPT_END: list[Callable[[], None]] = []


def close_process_group() -> None:
    """Tear the process group down at the end of a run, and return (a no-op without one).

    A recipe's ``main()`` ends with it, so a program that imports and calls ``main()`` (a sweep driver, a
    notebook, ``benchmarks/peak_memory.py``) gets control back. A recipe run as a script then calls
    :func:`end_script` as its last statement, which handles how a process that ran a gloo group must end.
    """
    global _GLOO_RAN
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    _GLOO_RAN = _GLOO_RAN or "gloo" in str(dist.get_backend())
    dist.destroy_process_group()


def at_script_end(fn: Callable[[], None]) -> None:
    """Run ``fn`` in :func:`end_script`, before the process ends (``atexit`` handlers do not run after ``os._exit``).

    For a wrapper that runs a recipe file as ``__main__`` and must act after it (benchmarks/peak_memory.py).
    """
    _AT_SCRIPT_END.append(fn)


def end_script() -> None:
    """The last statement of a recipe's ``if __name__ == "__main__":`` block: end the process, exit status 0.

    Runs the :func:`at_script_end` functions first. When a gloo process group ran in this process (CPU runs:
    DDP, DeepSpeed), the process then ends with ``os._exit(0)`` after flushing its output, without finalizing
    the interpreter; otherwise this returns and the interpreter exits as usual. Never call it from code that
    others call: nothing after it runs.

    Why not a normal exit after gloo: gloo's worker threads outlive ``destroy_process_group()``
    (``ProcessGroupGloo`` has no shutdown, and DeepSpeed's engine, its ZeRO-3 optimizer and every partitioned
    parameter, or DDP's reducer, still reference the groups). Such a thread releases each finished collective after
    the rank waiting on it has moved on, and a collective's tensors can belong to Python objects (ZeRO-3's
    parameters): releasing them takes the GIL. If the main thread has started finalizing the interpreter by then,
    Python ends the worker thread with ``pthread_exit``, whose unwinding through a ``noexcept`` destructor calls
    ``std::terminate``: "terminate called without an active exception", SIGABRT, and a launcher reporting a failure
    after the run had finished and saved (a core dump of such an abort: ``ProcessGroupGloo::runLoop`` ->
    ``~AsyncAllgatherWork`` -> ``TensorImpl::decref_pyobject`` -> ``take_gil`` -> ``PyThread_exit_thread``). How
    often depends on scheduling: 1 in 42 2-rank ZeRO-3 CPU launches of the tiny run here. Without finalization
    there is no moment at which a thread may not take the GIL. NCCL groups (one or more GPUs) end normally.
    """
    while _AT_SCRIPT_END:
        _AT_SCRIPT_END.pop(0)()
    if not _GLOO_RAN:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
