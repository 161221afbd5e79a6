"""Per-process threads for blocking reads: the image path's read-ahead (a :class:`ThreadGroup`)
and ``fetch_threads`` (a ``ThreadPoolExecutor``).

Both are created on first use in the process that uses them (a worker, after fork), their threads
named ``NAME-K`` (``gpufeed-read-0``...). What is inherited through fork has no threads, so the
registries are cleared in the child. Workers call :func:`shutdown_pools` on their way out; a
worker that is killed takes its threads with it.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

STOP_TIMEOUT_S = 10.0  # how long shutdown waits for a group's running jobs (then leaves them)

_lock = threading.Lock()
_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}  # name -> (threads, pool)
_groups: set[ThreadGroup] = set()  # started and not stopped


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at fork
    _pools.clear()
    _groups.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def thread_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool ``name`` with at least ``threads`` threads (created, or replaced by a
    larger one, on demand; a replaced pool's threads finish their work and exit)."""
    with _lock:
        entry = _pools.get(name)
        if entry is not None and entry[0] >= threads:
            return entry[1]
        counter = itertools.count()

        def name_thread() -> None:
            threading.current_thread().name = f"{name}-{next(counter)}"

        pool = ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=name_thread)
        _pools[name] = (threads, pool)
    if entry is not None:
        entry[1].shutdown(wait=False)
    return pool


class ThreadGroup:
    """``threads`` daemon threads named ``NAME-K``, each running ``serve(inbox)``: a loop that
    takes items from the one FIFO ``inbox`` queue and returns at a ``None``. Lighter than a
    ``ThreadPoolExecutor`` (no future, work item or idle semaphore per job: one queue put wakes
    a thread); what an item means and how results travel is the owner's
    (``gpufeed.image._reads``).
    """

    def __init__(self, name: str, threads: int, serve: Callable[[queue.SimpleQueue[Any]], None]) -> None:
        self.name = name
        self.pid = os.getpid()
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stopped = False
        self._threads = [threading.Thread(target=serve, args=(self.inbox,), name=f"{name}-{k}", daemon=True)
                         for k in range(threads)]
        with _lock:
            _groups.add(self)
        for thread in self._threads:
            thread.start()

    def alive(self) -> bool:
        """Whether any of the threads still runs."""
        return any(thread.is_alive() for thread in self._threads)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Drop the queued items, let running jobs finish (up to ``timeout_s`` in all, after which
        they are left to end with the process: the threads are daemons) and end the threads;
        idempotent."""
        self.stopped = True
        with _lock:
            _groups.discard(self)
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self.inbox.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


def shutdown_pools() -> None:
    """Stop this process's pools and thread groups: queued work is cancelled (dropped), running
    work finishes."""
    with _lock:
        pools = [pool for _, pool in _pools.values()]
        _pools.clear()
        groups = list(_groups)
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)
    for group in groups:
        group.stop()


def settle(futures: list[Future[Any]]) -> None:
    """Cancel what has not started and wait for what has: after an error, nothing of a task
    may still run when the next task starts (it would exceed the concurrency and budget)."""
    for future in futures:
        future.cancel()
    wait_futures(futures)
