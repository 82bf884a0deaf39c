"""Rank-aware helpers: print on the main process, and end a multi-process run cleanly."""

from __future__ import annotations

import logging
import os
import sys


def print0(*args, **kwargs) -> None:
    """print on the main process only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)


def close_process_group() -> None:
    """End a successful multi-process run: tear the process group down and exit without finalizing the interpreter.

    Call it last, after every file is written; in a process group it does not return (exit status 0). A no-op in a
    single process, so a recipe's ``main`` called in-process returns as before.

    Why not a normal exit: gloo's worker threads outlive ``destroy_process_group()`` (``ProcessGroupGloo`` has no
    shutdown, and DeepSpeed's engine, its ZeRO-3 optimizer and every partitioned parameter, or DDP's reducer, still
    reference the groups). Such a thread releases each finished collective after the rank waiting on it has moved
    on, and a collective's tensors can belong to Python objects (ZeRO-3's parameters): releasing them takes the GIL.
    If the main thread has started finalizing the interpreter by then, Python ends the worker thread with
    ``pthread_exit``, whose unwinding through a ``noexcept`` destructor calls ``std::terminate``: "terminate called
    without an active exception", SIGABRT, and a launcher reporting a failure after the run had finished and saved
    (a core dump of such an abort: ``ProcessGroupGloo::runLoop`` -> ``~AsyncAllgatherWork`` ->
    ``TensorImpl::decref_pyobject`` -> ``take_gil`` -> ``PyThread_exit_thread``). How often depends on scheduling:
    1 in 42 2-rank ZeRO-3 CPU launches of the tiny run here. Without finalization there is no moment at which a
    thread may not take the GIL, so buffered output is flushed and the process ends with ``os._exit``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
