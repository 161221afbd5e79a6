"""Reads in flight: a batch's encoded bytes read ahead on a worker's thread pool, in order.

``fill_batch`` asks for (bytes, label) of its samples one at a time, in index order, and decodes
each while the next ones are being read. A worker starts the reads of a task when it takes the
task, and also those of the tasks already waiting in its pipe (``ImageFiller.prefetch``), so a
batch does not begin with a stall. While a task is filled, whenever every read of the open tasks
is submitted and fewer than ``read_concurrency`` are pending, ``ReadAhead.more`` asks the worker
for the tasks that reached its pipe since: their reads start within one decode of their arrival,
not at their turn (the next task usually arrives while this one is filled).

All of a worker's open tasks (``BatchReads``) share one ``ReadAhead``: reads are submitted in
task order, then index order (a later task reads only once every read of the earlier ones is
submitted); at most ``read_concurrency`` are pending at once, and a new one starts only while
the bytes read (or being read) and not yet decoded, over all open tasks, stay within
``read_budget_bytes``, estimated from the largest sample seen in the open tasks and the last
closed one (so the bound can be passed by one image larger than any seen before). A task that is
skipped, or not run, is closed: its reads are cancelled or waited out and leave the budget. A
read's error is raised when its sample's turn comes, exactly where a sequential read would have
raised it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

from gpufeed._engine.threads import settle, thread_pool

READ_POOL = "gpufeed-read"
MORE_POLL_S = 0.002  # while waiting for a read with room for more, how often to look for tasks


def nbytes_of(data: Any) -> int:
    """Size of a read's bytes (bytes, bytearray, memoryview, numpy array)."""
    try:
        return memoryview(data).nbytes
    except TypeError:
        return len(data)


class ReadAhead:
    """One worker's read-ahead: its open tasks' reads, in order, within one concurrency and one
    budget (kept across tasks for its size estimate)."""

    def __init__(self, concurrency: int, budget_bytes: int) -> None:
        self.concurrency = concurrency
        self.budget_bytes = budget_bytes
        self.previous_max = 0  # largest sample of the last closed task (bytes)
        self.open: list[BatchReads] = []  # tasks begun and not closed, in task order
        # Takes the worker's tasks waiting in its pipe and begins their reads (None: none to ask).
        self.more: Callable[[], None] | None = None
        self._asking = False  # more() is running (it begins tasks, which fill again)

    def batch(self, read: Callable[[int], tuple[Any, int]], indices: list[int]) -> BatchReads:
        """Start reading ``indices`` (in order, after the open tasks) with
        ``read(index) -> (bytes, label)``."""
        reads = BatchReads(self, read, indices)
        self.open.append(reads)
        self.fill()
        return reads

    @property
    def pending(self) -> int:
        """Reads submitted and not yet taken by their task, over all open tasks."""
        return sum(len(b.pending) for b in self.open)

    def fill(self) -> bool:
        """Submit reads in task order while the concurrency and the budget allow; with room left
        over, ask for more tasks (``more``). Returns whether there was room to ask."""
        pending = self.pending
        estimate = max([self.previous_max, *(b.max_seen for b in self.open)])
        for reads in self.open:
            while reads.unsubmitted and pending < self.concurrency:
                # Before any size is known only one read runs; then as many as fit the budget.
                if pending and (estimate == 0 or (pending + 1) * estimate > self.budget_bytes):
                    return False
                reads.submit()
                pending += 1
            if reads.unsubmitted:
                return False  # a later task waits until every read of this one is submitted
        if pending >= self.concurrency or self.more is None:
            return False
        if not self._asking:  # room for reads the open tasks cannot use: more tasks?
            self._asking = True
            try:
                self.more()
            finally:
                self._asking = False
        return True


class BatchReads:
    """The reads of one task: :meth:`next` returns each (bytes, label) in order; :meth:`close`
    (always, in a ``finally``; idempotent) cancels or waits out what is still in flight."""

    def __init__(self, owner: ReadAhead, read: Callable[[int], tuple[Any, int]],
                 indices: list[int]) -> None:
        self._owner, self._read, self._indices = owner, read, indices
        self._pool = thread_pool(READ_POOL, owner.concurrency)
        self.pending: deque[Future[tuple[Any, int]]] = deque()
        self._submitted = 0
        self.max_seen = 0

    @property
    def unsubmitted(self) -> bool:
        return self._submitted < len(self._indices)

    def submit(self) -> None:
        self.pending.append(self._pool.submit(self._read, self._indices[self._submitted]))
        self._submitted += 1

    def next(self) -> tuple[Any, int]:
        """(bytes, label) of the next sample in order; its read's error if it failed."""
        if not self.pending:
            self.submit()  # only if an earlier task is still open (the owner serves it first)
        future = self.pending[0]
        # While the read is out and there is room, keep asking for tasks that arrive meanwhile
        # (they would otherwise wait for this read, and the next batch would begin with a stall).
        while not future.done() and self._owner.fill():
            wait_futures([future], timeout=MORE_POLL_S)
        data, label = self.pending.popleft().result()
        self.max_seen = max(self.max_seen, nbytes_of(data))
        self._owner.fill()
        return data, label

    def close(self) -> None:
        owner = self._owner
        if self not in owner.open:
            return
        owner.open.remove(self)
        pending = list(self.pending)
        self.pending.clear()
        settle(pending)
        if self.max_seen:
            owner.previous_max = self.max_seen
        owner.fill()
