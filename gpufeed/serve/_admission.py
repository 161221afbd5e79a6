"""Latency-aware admission for the DynamicBatcher (``max_latency_ms``): how long a request
submitted now would take to be answered, from the batches running, the queue ahead of it and
the batch run times measured so far.

A count bound (``max_queue``) cannot tell a burst that the model will drain in time from a
queue that will not: sized for the overload case it refuses bursts at moderate load, sized for
bursts it lets accepted requests miss their latency budget under overload. The prediction uses
what the count ignores: how far the running batches have got, and how long a batch of each
size takes on this model and machine.

The model of the future (no request is reordered, batches fill from the queue head):
the queue plus the new request splits into full batches of ``max_batch_size`` and one last
batch holding the new request; each batch starts on the slot that frees first (a slot frees
when its running batch's measured run time has passed, an idle slot now); the last batch, if
not full, may also wait for its oldest request's ``max_delay_ms``. Run times are the median of
the last ``RECENT`` runs per (padded) batch size, so that one slow batch (the first, while
workers start and caches fill) neither locks new requests out nor lingers; a size not yet seen
is taken from the nearest measured size below it scaled by the size ratio (batches cost at most
linearly more), or from the smallest measured size above it. All times are seconds on the
batcher's clock.

A request whose batch would find a slot free at once is never refused: it waits for nothing
but its own batch's timer, no choice answers it sooner, and its run refreshes the measurements.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable

__all__ = ["RunTimes"]

RECENT = 8  # runs per batch size whose median is the expected run time


class RunTimes:
    """Run times of the batches (measured and running) of one batcher; guarded by its lock."""

    def __init__(self) -> None:
        self.recent_s: dict[int, collections.deque[float]] = {}  # padded size -> last run seconds
        self.typical_s: dict[int, float] = {}  # padded batch size -> median of ``recent_s``
        self.running: dict[int, tuple[float, int]] = {}  # batch seq -> (start, padded size)

    def started(self, seq: int, now: float, size: int) -> None:
        self.running[seq] = (now, size)

    def ended(self, seq: int, now: float) -> None:
        """The batch ``seq`` returned (or raised): its run time joins its size's recent runs."""
        start_size = self.running.pop(seq, None)
        if start_size is None:
            return
        start, size = start_size
        recent = self.recent_s.setdefault(size, collections.deque(maxlen=RECENT))
        recent.append(max(0.0, now - start))
        self.typical_s[size] = statistics.median(recent)

    def estimate_s(self, size: int) -> float | None:
        """Expected run time of a batch of ``size`` (None before the first batch ended)."""
        if not self.typical_s:
            return None
        if size in self.typical_s:
            return self.typical_s[size]
        below = [s for s in self.typical_s if s < size]
        if below:
            s = max(below)
            return self.typical_s[s] * size / s
        return self.typical_s[min(self.typical_s)]

    def answer_in_s(self, now: float, queued: int, oldest_of_last: float, free_slots: int,
                    max_batch_size: int, delay_s: float,
                    padded: Callable[[int], int] = int) -> float | None:
        """Seconds until a request appended now, behind ``queued`` requests, would be answered.
        None while no run time is known, and when its batch would find a slot free at once (it
        waits for nothing but its own timer). ``oldest_of_last``: arrival of the oldest request
        of the batch the new one would join (``now`` when it would start a batch); ``padded``:
        the size a batch of n requests runs at (``BatcherConfig.padded_size``)."""
        full = self.estimate_s(max_batch_size)
        if full is None:
            return None
        # when each slot frees: running batches at their expected end (overdue ones: now), idle ones now
        frees = [max(now, start + (self.estimate_s(size) or 0.0)) for start, size in self.running.values()]
        frees += [now] * max(0, free_slots)  # together: one per model slot (max_concurrent_batches >= 1)
        frees.sort()
        total = queued + 1
        ahead = (total - 1) // max_batch_size  # full batches before the new request's batch
        last = total - ahead * max_batch_size
        k = len(frees)
        # full batches ahead take the slots in turn, each slot ``full`` seconds per batch
        start = frees[ahead % k] + (ahead // k) * full
        if start <= now:
            return None
        if last < max_batch_size:
            start = max(start, oldest_of_last + delay_s)
        return start + (self.estimate_s(padded(last)) or full) - now
