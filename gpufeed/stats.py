"""Loader counters: batches, per-stage seconds, data-wait, restarts. Cheap enough to leave on.

Updated by the iterator in the main thread only; ``snapshot()`` returns a plain dict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stats:
    """Running totals for one loader (all iterators, all epochs)."""

    batches: int = 0
    fetch_s: float = 0.0  # worker time getting samples (__getitem__; image path: reading bytes)
    collate_s: float = 0.0  # worker time in collate_fn
    pack_s: float = 0.0  # worker time placing payloads into the arena
    read_s: float = 0.0  # image path: worker time reading encoded bytes
    decode_s: float = 0.0  # image path: worker time decoding + cropping + resizing
    wait_s: float = 0.0  # main-thread time blocked in __next__ (the consumer's starvation)
    worker_restarts: int = 0
    overflow_bytes: int = 0  # payload bytes that did not fit a slot and were pickled
    started_at: float = field(default_factory=time.perf_counter)

    def add_batch(self, *, fetch_s: float, collate_s: float, pack_s: float, report: Any = None) -> None:
        self.batches += 1
        if report is not None:  # image path: the worker's read / decode+transform split
            self.read_s += report.read_s
            self.decode_s += report.decode_s
        self.fetch_s += fetch_s
        self.collate_s += collate_s
        self.pack_s += pack_s

    def add_wait(self, seconds: float) -> None:
        self.wait_s += seconds

    def add_restart(self) -> None:
        self.worker_restarts += 1

    def add_overflow(self, nbytes: int) -> None:
        self.overflow_bytes += nbytes

    def snapshot(self) -> dict[str, float | int]:
        """A copy of the totals plus ``elapsed_s`` and ``batches_per_s`` since creation."""
        elapsed = time.perf_counter() - self.started_at
        out = {k: v for k, v in self.__dict__.items() if k != "started_at"}
        out["elapsed_s"] = elapsed
        out["batches_per_s"] = self.batches / elapsed if elapsed > 0 else 0.0
        out["data_wait_fraction"] = self.wait_s / elapsed if elapsed > 0 else 0.0
        return out
