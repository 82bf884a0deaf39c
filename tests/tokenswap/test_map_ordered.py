"""``map_ordered`` on a pool shared by several maps at once (the streams of one ``tokenswap eval`` through one
endpoint): together they never run more calls than the pool has threads, each map still yields in input order, and
a map its consumer stops waits for its own calls only and leaves the pool to the others."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tokenswap.inference.ordered import map_ordered


class Gauge:
    """Calls in flight now, the most ever, and which items were called."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.called: list = []

    def call(self, item, delay: float = 0.002):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.called.append(item)
        time.sleep(delay * (1 + hash(item) % 3))  # uneven: answers come back out of order
        with self.lock:
            self.now -= 1
        return item


def test_maps_sharing_a_pool_run_at_most_its_threads_and_each_yields_in_order():
    gauge = Gauge()
    results = {}
    with ThreadPoolExecutor(4) as pool:
        def consume(name: str, n: int) -> None:
            items = [(name, i) for i in range(n)]
            results[name] = [o.result() for o in map_ordered(gauge.call, items, concurrency=4, executor=pool)]

        streams = [threading.Thread(target=consume, args=(name, 40)) for name in "abc"]
        for t in streams:
            t.start()
        for t in streams:
            t.join()
    assert {name: rows for name, rows in results.items()} == {n: [(n, i) for i in range(40)] for n in "abc"}
    assert gauge.most == 4  # three maps of concurrency 4 each, one pool of 4 threads: 4 calls at once, not 12


def test_a_map_stopped_early_on_a_shared_pool_waits_for_its_own_calls_and_leaves_the_pool_open():
    gauge = Gauge()
    with ThreadPoolExecutor(3) as pool:
        outcomes = map_ordered(lambda x: gauge.call(x, 0.01), range(100), concurrency=3, window=6, executor=pool)
        assert [next(outcomes).result() for _ in range(5)] == [0, 1, 2, 3, 4]
        outcomes.close()
        assert gauge.now == 0  # its calls in flight were waited for before close() returned
        started = len(gauge.called)
        assert started <= 5 + 6  # what was yielded, and at most a window more: the rest never started
        time.sleep(0.05)
        assert len(gauge.called) == started
        # The pool is the caller's, still open: another map runs on it.
        assert [o.result() for o in map_ordered(gauge.call, range(5), concurrency=3, executor=pool)] == list(range(5))
