"""Time for the batcher: monotonic seconds and a wait on a condition, replaceable in tests.

:class:`MonotonicClock` is the real one. :class:`ManualClock` only moves when told to
(:meth:`ManualClock.advance`), so a test can place every request and every timer expiry at an
exact virtual instant without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["MAX_WAIT_S", "Clock", "ManualClock", "MonotonicClock"]

MAX_WAIT_S = 1.0
"""Longest real-time wait of any batcher thread before it re-checks its state (seconds): every
blocking wait has a timeout, and an idle batcher wakes about once a second (no busy wait)."""


class Clock(Protocol):
    """What the batcher needs of time."""

    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wait(self, cond: threading.Condition, timeout_s: float | None) -> None:
        """Wait on ``cond`` (held by the caller) until notified or ``timeout_s`` of this clock's
        seconds have passed (``None``: until notified). Spurious returns are allowed."""
        ...


class MonotonicClock:
    """``time.monotonic`` and ``Condition.wait``, each wait capped at :data:`MAX_WAIT_S`."""

    def now(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout_s: float | None) -> None:
        """``cond.wait`` for ``timeout_s`` seconds, at most :data:`MAX_WAIT_S`."""
        cond.wait(MAX_WAIT_S if timeout_s is None else max(0.0, min(timeout_s, MAX_WAIT_S)))


class ManualClock:
    """A clock for tests: time stands still until :meth:`advance`, which wakes every waiter.

    A waiter's virtual timeout is not tracked: it re-reads :meth:`now` whenever it is woken,
    which :meth:`advance` does. :meth:`wait_idle` returns once a thread is asleep in
    :meth:`wait` having read the clock after the latest advance, i.e. has acted on it.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._now = float(start)
        self._generation = 0
        self._conds: list[threading.Condition] = []
        self._sleepers: dict[int, int] = {}  # thread ident -> generation it last read
        self._local = threading.local()

    def now(self) -> float:
        """The virtual time (seconds)."""
        with self._lock:
            self._local.generation = self._generation
            return self._now

    def wait(self, cond: threading.Condition, timeout_s: float | None) -> None:
        """Sleep on ``cond`` until notified (by :meth:`advance` or anyone), at most
        :data:`MAX_WAIT_S` real seconds."""
        ident = threading.get_ident()
        with self._lock:
            if all(c is not cond for c in self._conds):
                self._conds.append(cond)
            self._sleepers[ident] = getattr(self._local, "generation", -1)
            self._changed.notify_all()
        try:
            cond.wait(MAX_WAIT_S)
        finally:
            with self._lock:
                self._sleepers.pop(ident, None)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake every thread waiting through this clock."""
        if seconds < 0:
            raise ValueError(f"`seconds` must be >= 0 (a monotonic clock). Found: {seconds}.")
        with self._lock:
            self._now += seconds
            self._generation += 1
            conds = list(self._conds)
        for cond in conds:
            with cond:
                cond.notify_all()

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Block until some thread sleeps in :meth:`wait` having read the current time.

        Raises:
            TimeoutError: no thread did within ``timeout_s`` real seconds.
        """
        with self._lock:
            done = self._changed.wait_for(
                lambda: self._generation in self._sleepers.values(), timeout=timeout_s
            )
        if not done:
            raise TimeoutError(f"no thread went idle on the ManualClock within {timeout_s} s")
