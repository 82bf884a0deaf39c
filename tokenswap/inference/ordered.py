"""Many calls in flight, results committed in input order.

A build or an evaluation asks a model once per row; a serving engine's throughput comes from the
many requests it batches together, so rows are sent ``concurrency`` at a time. Whatever order the
replies arrive in, the caller sees them in input order, so every file it writes is byte-identical
to a run with one request in flight and a resumed run lines up with the rows it already committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Outcome", "map_ordered"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Outcome(Generic[T, R]):
    """The result of ``fn(item)`` for the ``index``-th item: ``value``, or the exception it raised."""

    index: int
    item: T
    value: R | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def result(self) -> R:
        """The value, or re-raise the call's exception."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def map_ordered(
    fn: Callable[[T], R],
    items: Iterable[T],
    concurrency: int,
    window: int | None = None,
    executor: ThreadPoolExecutor | None = None,
) -> Iterator[Outcome[T, R]]:
    """Call ``fn`` on every item with up to ``concurrency`` calls at once; yield outcomes in input order.

    ``items`` is read lazily: at most ``window`` items (default ``4 * concurrency``) are started but
    not yet yielded, so a slow early row holds memory for a bounded number of later ones and a
    300K-row stream is never materialised. An exception raised by ``fn`` is delivered in its
    :class:`Outcome`, never raised here, so the caller decides whether one failed row stops a run.
    With ``concurrency == 1`` calls run one after another in the calling thread, exactly as a plain
    loop would.

    If the consumer stops early (``break``, an exception, ``close()``), items not yet started are
    never started and the calls in flight are waited for before the generator returns.

    Args:
        fn: the call per item; must be thread-safe when ``concurrency > 1``.
        items: the inputs, in the order their outcomes are wanted.
        concurrency: calls in flight at most (>= 1).
        window: items started but not yet yielded, at most (>= concurrency).
        executor: run the calls on this pool (shared by several calls of ``map_ordered`` at once, so that their
            calls together use one set of ``concurrency`` threads) instead of a pool of its own; it is left open.

    Yields:
        One :class:`Outcome` per item, in input order.

    >>> [o.value for o in map_ordered(lambda x: x * x, range(5), concurrency=3)]
    [0, 1, 4, 9, 16]
    """
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    window = 4 * concurrency if window is None else window
    if window < concurrency:
        raise ValueError(f"window must be >= concurrency ({concurrency}), got {window}")
    if concurrency == 1:
        for index, item in enumerate(items):
            try:
                yield Outcome(index, item, value=fn(item))
            except Exception as err:  # noqa: BLE001 - delivered to the caller, who decides
                yield Outcome(index, item, error=err)
        return

    stop = threading.Event()

    def call(item: T) -> R:
        if stop.is_set():
            raise _Cancelled()
        return fn(item)

    pending: dict[int, tuple[T, Future]] = {}
    iterator = enumerate(items)
    next_out = 0
    exhausted = False
    own = executor is None
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tokenswap-request") if own else executor
    try:
        try:
            while True:
                while not exhausted and len(pending) < window:
                    try:
                        index, item = next(iterator)
                    except StopIteration:
                        exhausted = True
                        break
                    pending[index] = (item, pool.submit(call, item))
                if next_out not in pending:
                    return
                item, future = pending.pop(next_out)
                try:
                    yield Outcome(next_out, item, value=future.result())
                except _Cancelled:  # pragma: no cover - only after the consumer stopped
                    return
                except Exception as err:  # noqa: BLE001 - delivered to the caller
                    yield Outcome(next_out, item, error=err)
                next_out += 1
        finally:
            stop.set()
            for _, future in pending.values():
                future.cancel()
    finally:
        if own:
            pool.shutdown(wait=True)
        else:  # the calls of this map still running on the shared pool: waited for, as the own pool's shutdown does
            wait([future for _, future in pending.values()])


class _Cancelled(Exception):
    pass
