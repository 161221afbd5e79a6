"""Loader counters: batches, samples, per-stage seconds, data wait, queue depth, faults.

Cheap enough to leave on: the iterator adds a few floats per batch in the main thread; workers
time their stages and send the figures with each reply. ``snapshot()`` returns a plain dict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import psutil

# The per-stage seconds, in pipeline order: keys of ``stats()``, fields of ``Stats`` and of
# ``gpufeed.doctor.Evidence``; ``gpufeed.metrics`` labels them without the ``_s``.
STAGES: tuple[str, ...] = ("fetch_s", "read_s", "decode_s", "transform_s", "collate_s", "pack_s", "h2d_s")


@dataclass
class Stats:
    """Running totals for one loader (all iterators, all epochs).

    Stage seconds are summed over workers (CPU-side work, so with N workers they can add up to
    N x wall time); ``wait_s`` is wall time the consumer spent blocked in ``__next__``.
    """

    batches: int = 0
    samples: int = 0
    fetch_s: float = 0.0  # generic path: dataset __getitem__ / __getitems__
    read_s: float = 0.0  # image path: reading encoded bytes (file, LMDB) or the cache
    reads: int = 0  # image path: reads of the source by the workers (cache hits not counted)
    read_latency_s: float = 0.0  # their summed duration, each timed on the thread that read
    read_concurrency_max: int = 0  # image path: most reads in flight a worker allowed for a batch
    decode_s: float = 0.0  # image path: JPEG/PNG decode (DCT-scaled)
    transform_s: float = 0.0  # image path: crop, resize, flip into the batch row
    collate_s: float = 0.0  # generic: collate_fn; image path: compaction + dtype/normalize
    pack_s: float = 0.0  # placing payloads in the arena
    h2d_s: float = 0.0  # device=: host-to-device copy time measured by CUDA events
    wait_s: float = 0.0  # consumer blocked in __next__
    waits: int = 0
    queue_depth_sum: int = 0  # ready batches at each __next__, for the mean
    queue_depth: int = 0  # ready batches at the last __next__
    errors: int = 0  # exceptions raised by dataset/collate code in workers
    worker_restarts: int = 0
    parent_batches: int = 0  # batches completed in the main process, no worker (all cache hits)
    parent_s: float = 0.0  # main-process seconds making those (cache copies, labels)
    overflow_bytes: int = 0  # payload bytes that did not fit a slot and were pickled
    pinned_bytes: int = 0  # device=: arena bytes page-locked now (not a total: it falls when trimmed)
    first_wait_at: float | None = field(default=None, repr=False)

    def add_batch(self, *, samples: int, fetch_s: float, collate_s: float, pack_s: float, report: Any = None) -> None:
        self.batches += 1
        self.samples += samples
        self.fetch_s += fetch_s
        self.pack_s += pack_s
        if report is None:
            self.collate_s += collate_s
        else:  # image path: the worker's stage split
            self.read_s += report.read_s
            self.reads += getattr(report, "reads", 0)
            self.read_latency_s += getattr(report, "read_latency_s", 0.0)
            self.read_concurrency_max = max(self.read_concurrency_max,
                                            getattr(report, "read_concurrency", 1))
            self.decode_s += report.decode_s
            self.transform_s += report.transform_s
            self.collate_s += report.post_s

    def add_parent_batch(self, *, samples: int, seconds: float) -> None:
        """A batch the main process made itself (not in the worker stage seconds)."""
        self.batches += 1
        self.samples += samples
        self.parent_batches += 1
        self.parent_s += seconds

    def add_wait(self, seconds: float, queue_depth: int) -> None:
        if self.first_wait_at is None:
            self.first_wait_at = time.perf_counter() - seconds
        self.wait_s += seconds
        self.waits += 1
        self.queue_depth = queue_depth
        self.queue_depth_sum += queue_depth

    def snapshot(self) -> dict[str, Any]:
        """The totals plus rates over the time since the first batch was requested."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "first_wait_at"}
        elapsed = 0.0 if self.first_wait_at is None else time.perf_counter() - self.first_wait_at
        out["elapsed_s"] = elapsed
        out["batches_per_s"] = self.batches / elapsed if elapsed > 0 else 0.0
        out["samples_per_s"] = self.samples / elapsed if elapsed > 0 else 0.0
        out["data_wait_fraction"] = min(1.0, self.wait_s / elapsed) if elapsed > 0 else 0.0
        out["queue_depth_mean"] = self.queue_depth_sum / self.waits if self.waits else 0.0
        out.pop("queue_depth_sum")
        return out


def worker_usage(pids: list[int]) -> list[dict[str, Any]]:
    """CPU seconds (user + system) and resident/proportional memory of each live worker."""
    rows = []
    for worker_id, pid in enumerate(pids):
        try:
            proc = psutil.Process(pid)
            cpu = proc.cpu_times()
            mem = proc.memory_info()
            rows.append({"worker": worker_id, "pid": pid, "cpu_s": cpu.user + cpu.system, "rss_bytes": mem.rss})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return rows
