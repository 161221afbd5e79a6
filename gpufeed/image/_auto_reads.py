"""Automatic reads in flight: a worker decides by itself when to read ahead.

gpufeed's own local sources (``ImageFolder`` on a local path, ``LMDBDataset``) default to
``read_concurrency=None``, "auto": each worker starts reading one sample at a time (on local
disk, page-cached reads take 20-50 us against ~1 ms of decode, and read threads would cost more
CPU than they hide). After each task, :meth:`AutoReads.observe` compares the decoding thread's
wait for bytes per read with its decode + transform time per kept sample; when the wait is at
least half the work on ``PATIENCE`` tasks in a row (reads stall the worker: a network file
system mounted as a local path), the worker switches to read-ahead once, for good, with
``clamp(ceil(2 x latency / work) + 1, 2, 64)`` reads in flight, enough to cover the measured
latency of one read twice over. The switch changes timing only, never results: reads in flight
keep order, determinism, on_error and re-runs exactly as sequential reads.
"""

from __future__ import annotations

import math

#: The wait for bytes, as a share of decode + transform time, from which reads stall a worker.
STALL_RATIO = 0.5
#: Tasks in a row that must stall before the switch (one slow first task is not enough).
PATIENCE = 2
MIN_CONCURRENCY, MAX_CONCURRENCY = 2, 64


def auto_concurrency(latency_s: float, work_s: float) -> int:
    """Reads in flight that cover a read of ``latency_s`` seconds behind ``work_s`` seconds of
    decode per sample: ``clamp(ceil(2 x latency / work) + 1, 2, 64)``."""
    if work_s <= 0:
        return MAX_CONCURRENCY
    return max(MIN_CONCURRENCY, min(MAX_CONCURRENCY, math.ceil(2 * latency_s / work_s) + 1))


class AutoReads:
    """One worker's automatic ``read_concurrency``: 1 until reads stall it, then a fixed
    concurrency (:func:`auto_concurrency`); it never changes again after the switch."""

    def __init__(self, stall_ratio: float = STALL_RATIO, patience: int = PATIENCE) -> None:
        self.stall_ratio, self.patience = stall_ratio, patience
        self.concurrency = 1  # reads in flight now
        self._stalls = 0  # tasks in a row whose reads stalled the worker

    def observe(self, wait_s: float, reads: int, latency_s: float, work_s: float,
                samples: int) -> int:
        """Take one task's figures (``wait_s``: the decoding thread's wait for bytes, seconds,
        over ``reads`` reads lasting ``latency_s`` in all; ``work_s``: decode + transform over
        ``samples`` kept samples) and return the concurrency for the next tasks."""
        if self.concurrency > 1 or reads <= 0 or samples <= 0:
            return self.concurrency  # decided already, or nothing read/decoded to compare
        work = work_s / samples
        if wait_s / reads >= self.stall_ratio * work:
            self._stalls += 1
        else:
            self._stalls = 0
        if self._stalls >= self.patience:
            self.concurrency = auto_concurrency(latency_s / reads, work)
        return self.concurrency
