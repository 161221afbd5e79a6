"""Per-process thread pools for blocking reads: the image path's read-ahead and ``fetch_threads``.

A pool is created on first use in the process that uses it (a worker, after fork), its threads
named ``NAME-K`` (``gpufeed-read-0``...). A pool inherited through fork has no threads, so the
registry is cleared in the child. Workers call :func:`shutdown_pools` on their way out; a worker
that is killed takes its threads with it.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

_lock = threading.Lock()
_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}  # name -> (threads, pool)


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at fork
    _pools.clear()


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


def shutdown_pools() -> None:
    """Stop this process's pools: queued work is cancelled, running work finishes."""
    with _lock:
        pools = [pool for _, pool in _pools.values()]
        _pools.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


def settle(futures: list[Future[Any]]) -> None:
    """Cancel what has not started and wait for what has: after an error, nothing of a task
    may still run when the next task starts (it would exceed the concurrency and budget)."""
    for future in futures:
        future.cancel()
    wait_futures(futures)
