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

The reads run on the worker's ``gpufeed-read-K`` threads (a ``ThreadGroup``, one per
``ReadAhead``, ``read_concurrency`` threads): a read is one ``(task, seq)`` job on the owner's
``jobs`` deque, claimed by the thread that takes it (``claims``), and its result comes back on
the owner's ``done`` queue, which the decoding thread drains. The decoding thread wakes one read
thread per batch of reads it queues; the threads wake each other for the rest (``_serve``). No
future, condition or waiter per read: at 30 ms per read a ``ThreadPoolExecutor`` cost about
100 us of CPU per read, near a tenth of a 224 px decode (see docs/design/image-path.md).
Bookkeeping is O(1) per read: counters, and the open tasks whose reads are not all submitted.
"""

from __future__ import annotations

import functools
import os
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gpufeed._engine.threads import ThreadGroup
from gpufeed.errors import SKIP_HINT, ReadError, add_note

READ_POOL = "gpufeed-read"
MORE_POLL_S = 0.002  # while waiting for a read with room for more, how often to look for tasks
WAIT_S = 1.0  # while waiting for a read with no room for more: how often to check the threads live


def nbytes_of(data: Any) -> int:
    """Size of a read's bytes (bytes, bytearray, memoryview, numpy array)."""
    try:
        return memoryview(data).nbytes
    except TypeError:
        return len(data)


def _serve(jobs: deque[tuple[BatchReads, int]], wake: queue.SimpleQueue[int | None]) -> None:
    """A read thread: wait for a wake-up ``k`` (k jobs wait in ``jobs``), take the oldest job,
    pass the other k - 1 on (waking up to two idle threads), and run the job ``(task, seq)``
    unless its task cancelled it. The decoding thread thus wakes one thread per batch of reads
    it submits, not one per read: a wake-up from a thread that holds the GIL costs it a context
    switch or two (the woken thread runs, finds the GIL taken, and sleeps again)."""
    get, put = wake.get, wake.put
    while True:
        k = get()
        if k is None:
            return
        reads, seq = jobs.popleft()  # (k > 0: the jobs were queued before their wake-up)
        rest = k - 1
        if rest > 1:
            put(rest // 2)
            put(rest - rest // 2)
        elif rest:
            put(rest)
        index = reads.claims.pop(seq, None)  # atomic: close() may take it first (cancelled)
        if index is not None:
            reads.run(seq, index)
        del reads


class ReadAhead:
    """One worker's read-ahead: its open tasks' reads, in order, within one concurrency and one
    budget (kept across tasks for its size estimate)."""

    def __init__(self, concurrency: int, budget_bytes: int) -> None:
        self.concurrency = concurrency
        self.budget_bytes = budget_bytes
        self.previous_max = 0  # largest sample of the last closed task (bytes)
        self.open: list[BatchReads] = []  # tasks begun and not closed, in task order
        self.pending = 0  # reads submitted and not yet taken by their task, over the open tasks
        # Takes the worker's tasks waiting in its pipe and begins their reads (None: none to ask).
        self.more: Callable[[], None] | None = None
        self._asking = False  # more() is running (it begins tasks, which fill again)
        self._feeding: deque[BatchReads] = deque()  # open tasks with reads not yet submitted
        self._open_max = 0  # largest sample seen in the open tasks (bytes)
        self._threads: ThreadGroup | None = None  # made at the first task, in this process
        self._jobs: deque[tuple[BatchReads, int]] = deque()  # submitted, not yet taken by a thread
        self.unwoken = 0  # reads queued since the threads were last woken (wake())
        self.done: queue.SimpleQueue[tuple[BatchReads, int, bool, Any, float]] = queue.SimpleQueue()

    def batch(self, read: Callable[[int], tuple[Any, int]], indices: list[int]) -> BatchReads:
        """Start reading ``indices`` (in order, after the open tasks) with
        ``read(index) -> (bytes, label)``."""
        threads = self._threads
        if threads is None or threads.stopped or threads.pid != os.getpid():
            if threads is not None and threads.pid != os.getpid():
                # inherited through fork: no threads here, so none of those reads will come
                self.open, self._feeding, self.pending, self.unwoken = [], deque(), 0, 0
                self.done, self._jobs = queue.SimpleQueue(), deque()
            self._jobs.clear()  # (stopped: what was queued was dropped with the wake-ups)
            self._threads = ThreadGroup(READ_POOL, self.concurrency,
                                        functools.partial(_serve, self._jobs))
        reads = BatchReads(self, read, indices, self._jobs)
        self.open.append(reads)
        self._feeding.append(reads)
        self.fill()
        return reads

    def stop(self) -> None:
        """End the read threads (what is queued is dropped; the open tasks are closed first)."""
        for reads in list(self.open):
            reads.close()
        if self._threads is not None:
            self._threads.stop()
            self._threads = None
        self._jobs.clear()

    def fill(self) -> bool:
        """Submit reads in task order while the concurrency and the budget allow; with room left
        over, ask for more tasks (``more``). Returns whether there was room to ask."""
        try:
            if not self._submit():
                return False
        finally:
            self.wake()
        if self.pending >= self.concurrency or self.more is None:
            return False
        if not self._asking:  # room for reads the open tasks cannot use: more tasks?
            self._asking = True
            try:
                self.more()
            finally:
                self._asking = False
        return True

    def _submit(self) -> bool:
        """Submit reads in task order within the concurrency and the budget; whether every read
        of the open tasks is submitted."""
        estimate = max(self.previous_max, self._open_max)
        feeding = self._feeding
        while feeding:
            reads = feeding[0]
            while reads.unsubmitted and self.pending < self.concurrency:
                # Before any size is known only one read runs; then as many as fit the budget.
                if self.pending and (estimate == 0 or (self.pending + 1) * estimate > self.budget_bytes):
                    return False
                reads.submit()
            if reads.unsubmitted:
                return False  # a later task waits until every read of this one is submitted
            feeding.popleft()
        return True

    def wake(self) -> None:
        """Tell the read threads how many reads were queued since the last call (one wake-up)."""
        if self.unwoken:
            assert self._threads is not None  # made by batch(), before any submit
            self._threads.inbox.put(self.unwoken)
            self.unwoken = 0

    def receive(self, timeout_s: float | None) -> bool:
        """Hand the finished reads to their tasks: those already back, or else (with a timeout)
        the first to come within it. Returns whether any came."""
        done = self.done
        try:
            item = done.get_nowait() if timeout_s is None else done.get(timeout=timeout_s)
        except queue.Empty:
            return False
        while True:
            reads, seq, ok, value, elapsed_s = item
            reads.outstanding -= 1
            if not reads.closed:
                reads.results[seq] = (ok, value)
                reads.reads_done += 1
                reads.latency_s += elapsed_s
            del item, reads, value
            try:
                item = done.get_nowait()
            except queue.Empty:
                return True

    def wait(self, reads: BatchReads, seq: int, more: bool) -> None:
        """Block until a read comes back (``more``: look for tasks every ``MORE_POLL_S`` while
        there is room); raise if the read threads are gone."""
        if self.receive(MORE_POLL_S if more else WAIT_S):
            return
        threads = self._threads
        if threads is None or threads.stopped or (not more and not threads.alive()):
            raise RuntimeError(
                f"gpufeed: the read threads of process {os.getpid()} are gone while sample "
                f"index {reads.index_of(seq)} was being read (stopped by shutdown_pools(), or "
                f"the interpreter is shutting down); nothing to do but start a new read-ahead")


class BatchReads:
    """The reads of one task: :meth:`next` returns each (bytes, label) in order; :meth:`close`
    (always, in a ``finally``; idempotent) cancels or waits out what is still in flight."""

    def __init__(self, owner: ReadAhead, read: Callable[[int], tuple[Any, int]],
                 indices: list[int], jobs: deque[tuple[BatchReads, int]]) -> None:
        self._owner, self._read, self._indices, self._jobs = owner, read, indices, jobs
        self.claims: dict[int, int] = {}  # seq -> index: submitted, not yet taken by a thread
        self.results: dict[int, tuple[bool, Any]] = {}  # seq -> (ok, (bytes, label) or error)
        self.outstanding = 0  # submitted reads whose result has not come back (nor been cancelled)
        self.closed = False
        self._submitted = 0
        self._taken = 0  # reads handed out by next()
        self.max_seen = 0
        self.reads_done = 0  # reads that came back (bytes or error)
        self.latency_s = 0.0  # their summed duration, each timed on its read thread

    @property
    def unsubmitted(self) -> bool:
        return self._submitted < len(self._indices)

    @property
    def pending(self) -> int:
        """Reads submitted and not yet taken."""
        return self._submitted - self._taken

    def index_of(self, seq: int) -> int:
        return self._indices[seq]

    def submit(self) -> None:
        """Queue the next read (the owner wakes the threads: :meth:`ReadAhead.wake`)."""
        seq = self._submitted
        self.claims[seq] = self._indices[seq]
        self._submitted += 1
        self.outstanding += 1
        self._owner.pending += 1
        self._owner.unwoken += 1
        self._jobs.append((self, seq))

    def run(self, seq: int, index: int) -> None:
        """On a read thread: read ``index`` and send the result (or the error) back, timed."""
        t0 = time.perf_counter()
        try:
            result: tuple[BatchReads, int, bool, Any, float] = (
                self, seq, True, self._read(index), time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 (raised by next() at the sample's turn)
            result = (self, seq, False, exc, time.perf_counter() - t0)
        self._owner.done.put(result)

    def next(self) -> tuple[Any, int]:
        """(bytes, label) of the next sample in order; its read's error if it failed."""
        owner = self._owner
        seq = self._taken
        if seq == self._submitted:
            self.submit()  # only if an earlier task is still open (the owner serves it first)
            owner.wake()
        results = self.results
        # While the read is out and there is room, keep asking for tasks that arrive meanwhile
        # (they would otherwise wait for this read, and the next batch would begin with a stall).
        if seq not in results:
            owner.receive(None)
        while seq not in results:
            owner.wait(self, seq, owner.fill())
        ok, value = results.pop(seq)
        self._taken += 1
        owner.pending -= 1
        if not ok:
            try:
                raise value
            finally:
                del value
        data, label = value
        size = nbytes_of(data)
        if size > self.max_seen:
            self.max_seen = size
            owner._open_max = max(owner._open_max, size)
        owner.fill()
        return data, label

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        owner = self._owner
        owner.open.remove(self)
        if self in owner._feeding:
            owner._feeding.remove(self)
        for seq in list(self.claims):  # not yet taken by a thread: cancelled
            if self.claims.pop(seq, None) is not None:
                self.outstanding -= 1
        while self.outstanding:  # started: waited out (nothing of a task runs after it)
            owner.wait(self, self._taken, False)
        owner.pending -= self.pending
        self._taken = self._submitted
        self.results.clear()
        if self.max_seen:
            owner.previous_max = self.max_seen
        owner._open_max = max((b.max_seen for b in owner.open), default=0)
        owner.fill()


#: A read's errors that are its file's own and stay on a retry: the sample is left out of its
#: batch under ``on_error="skip"`` (a remote read that failed for good raises ``ReadError``).
FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def where() -> str:
    """The process running this, for messages: "worker 1 (pid 4242)" or "the main process (pid
    4242)"."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    who = "the main process" if info is None else f"worker {info.id}"
    return f"{who} (pid {os.getpid()})"


def skip_failed_read(exc: OSError, on_error: str, describe: str, index: int) -> bool:
    """Whether to leave out sample ``index`` (``describe``: its file) whose read raised ``exc``:
    under ``on_error="skip"``, a ``ReadError`` or one of :data:`FILE_ERRORS` (a file gone, a
    directory, no permission). Otherwise the caller re-raises ``exc``, which this notes with
    the sample, the process and, for a file's own error, the fix (a ``ReadError`` names them)."""
    own = isinstance(exc, (ReadError, *FILE_ERRORS))
    if on_error == "skip" and own:
        return True
    if not isinstance(exc, ReadError):
        fix = (f" Check the file, or pass {SKIP_HINT} to leave such samples out of their batch."
               if own else "")
        add_note(exc, f"gpufeed: the read of sample index {index} ({describe}) failed in {where()}.{fix}")
    return False
