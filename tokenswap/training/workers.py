"""Data-loader workers that outlive a job's SIGTERM and end with the run.

A scheduler's preemption notice (Slurm, ``kill -TERM -<pgid>``) reaches every process of the job, the data-loader
workers too. The trainer handles it (:class:`~tokenswap.training.checkpoint.CheckpointCallback`: finish the step,
save, exit 143), and for that its workers must go on serving batches, so they ignore SIGTERM. Two things follow:

* **From the fork on.** torch's worker installs a SIGTERM handler of its own as it starts (one that dies of any
  SIGTERM not sent by its parent), and a worker that died of it fails the step with "DataLoader worker exited
  unexpectedly". While a training loop runs (:func:`protect_forks`), every process forked from the main process
  starts with SIGTERM *blocked*: no handler, torch's included, sees a signal that arrives before the worker's first
  batch. :func:`ignore_sigterm_in_worker` (the collator calls it in the worker) then ignores SIGTERM, which discards
  a pending one, and unblocks it.
* **Ended by the run, not by the interpreter's exit.** At exit, ``multiprocessing`` ends its daemonic children with
  SIGTERM and then waits for them: with workers that ignore it, the wait never ends. torch shuts a loader's workers
  down itself only when the iterator is dropped: a persistent-workers loader (``dataloader_persistent_workers``,
  kept by the Trainer) without pinned memory keeps them until exit, and so does a traceback that holds the epoch's
  iterator. :func:`end_loader_workers` shuts every live loader iterator of the process down the way torch's
  iterator does when dropped (a stop message to each worker, then join); :func:`~tokenswap.training.train` calls it
  when training ends, however it ends, and it runs again at interpreter exit, ahead of ``multiprocessing``'s wait.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import threading
import time

import torch.utils.data  # noqa: F401 - its atexit hooks must be registered before ours (ours then runs first)

__all__ = ["FAULT_WORKER_HOLD_ENV", "end_loader_workers", "ignore_sigterm_in_worker", "protect_forks"]

FAULT_WORKER_HOLD_ENV = "TOKENSWAP_FAULT_WORKER_HOLD_S"
"""Fault injection (benchmarks/faults.py, tests): ``S``: each data-loader worker, before its first batch, says so
and waits until a SIGTERM is pending for it (at most ``S`` seconds), so a job's SIGTERM lands in the worker's start.
Unset in real runs."""

_PROTECTING: int | None = None
"""The PID whose forks start with SIGTERM blocked (the trainer's main process, while it trains), else None."""


def _block_sigterm_in_child() -> None:
    global _PROTECTING
    if _PROTECTING is not None and os.getpid() != _PROTECTING:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _PROTECTING = None  # the child's own forks are not the trainer's


os.register_at_fork(after_in_child=_block_sigterm_in_child)


def protect_forks(on: bool) -> None:
    """While ``on``, processes forked from this one start with SIGTERM blocked (see the module docstring).

    Forks that exec a program (``subprocess``) do not run fork hooks and keep the normal signal mask; a process
    forked with ``multiprocessing`` during training that is no data-loader worker keeps SIGTERM blocked.
    """
    global _PROTECTING
    _PROTECTING = os.getpid() if on else None


def ignore_sigterm_in_worker() -> None:
    """In a data-loader worker: ignore SIGTERM from now on (a pending one is discarded) and unblock it."""
    hold = float(os.environ.get(FAULT_WORKER_HOLD_ENV) or 0)
    if hold > 0:
        print(f"[tokenswap] {FAULT_WORKER_HOLD_ENV}: data-loader worker {os.getpid()} waits for a SIGTERM before its "
              "first batch", flush=True)
        deadline = time.monotonic() + hold
        while signal.SIGTERM not in signal.sigpending() and time.monotonic() < deadline:
            time.sleep(0.01)
    if threading.current_thread() is threading.main_thread():  # signal dispositions are set from the main thread
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def end_loader_workers() -> int:
    """Shut down the workers of every live multi-process data-loader iterator of this process; how many were live.

    Found by the garbage collector's list, not through the Trainer: the Trainer's persistent loader, a resumed
    epoch's skip-batches copy, evaluation loaders and an iterator a traceback keeps alive all count. A
    persistent-workers loader forgets its shut iterator, so iterating it again starts fresh workers.
    """
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    ended = 0
    loaders = []
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: it reads __class__, which some lazy module proxies warn about
        if issubclass(kind, _MultiProcessingDataLoaderIter):
            if not obj._shutdown:
                obj._shutdown_workers()
                ended += 1
        elif issubclass(kind, DataLoader):
            loaders.append(obj)
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        if isinstance(iterator, _MultiProcessingDataLoaderIter) and iterator._shutdown:
            loader._iterator = None
    return ended


atexit.register(end_loader_workers)
