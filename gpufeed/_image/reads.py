"""Reads in flight: a batch's encoded bytes read ahead on a worker's thread pool, in order.

``fill_batch`` asks for (bytes, label) of its samples one at a time, in index order, and decodes
each while the next ones are being read. At most ``read_concurrency`` reads run at once, and a
new one starts only while the bytes read (or being read) and not yet decoded stay within
``read_budget_bytes``, estimated from the largest sample seen in this task and the previous one
(so the bound can be passed by one image larger than any seen before). Read-ahead stays inside
the task: nothing is read for a task the worker has not started, so skipping queued tasks at
shutdown and re-running a dead worker's tasks mean what they did. A read's error is raised when
its sample's turn comes, exactly where a sequential read would have raised it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from gpufeed._engine.threads import settle, thread_pool

READ_POOL = "gpufeed-read"


def nbytes_of(data: Any) -> int:
    """Size of a read's bytes (bytes, bytearray, memoryview, numpy array)."""
    try:
        return memoryview(data).nbytes
    except TypeError:
        return len(data)


class ReadAhead:
    """One worker's read-ahead (kept across tasks for its size estimate)."""

    def __init__(self, concurrency: int, budget_bytes: int) -> None:
        self.concurrency = concurrency
        self.budget_bytes = budget_bytes
        self.previous_max = 0  # largest sample of the previous task (bytes)

    def batch(self, read: Callable[[int], tuple[Any, int]], indices: list[int]) -> BatchReads:
        """Start reading ``indices`` (in order) with ``read(index) -> (bytes, label)``."""
        return BatchReads(self, read, indices)


class BatchReads:
    """The reads of one task: :meth:`next` returns each (bytes, label) in order; :meth:`close`
    (always, in a ``finally``) cancels or waits out what is still in flight."""

    def __init__(self, owner: ReadAhead, read: Callable[[int], tuple[Any, int]],
                 indices: list[int]) -> None:
        self._owner, self._read, self._indices = owner, read, indices
        self._pool = thread_pool(READ_POOL, owner.concurrency)
        self._pending: deque[Future[tuple[Any, int]]] = deque()
        self._submitted = 0
        self._max_seen = 0
        self._fill()

    def _fill(self) -> None:
        owner = self._owner
        estimate = max(owner.previous_max, self._max_seen)
        while self._submitted < len(self._indices) and len(self._pending) < owner.concurrency:
            # Before any size is known only one read runs; then as many as fit the budget.
            if self._pending and (estimate == 0
                                  or (len(self._pending) + 1) * estimate > owner.budget_bytes):
                break
            self._pending.append(self._pool.submit(self._read, self._indices[self._submitted]))
            self._submitted += 1

    def next(self) -> tuple[Any, int]:
        """(bytes, label) of the next sample in order; its read's error if it failed."""
        data, label = self._pending.popleft().result()
        self._max_seen = max(self._max_seen, nbytes_of(data))
        self._fill()
        return data, label

    def close(self) -> None:
        pending = list(self._pending)
        self._pending.clear()
        settle(pending)
        if self._max_seen:
            self._owner.previous_max = self._max_seen
