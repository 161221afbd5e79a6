"""One measurement of the tuner: one loader at one worker count."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TuneRow:
    """One measurement: one loader at one worker count.

    Attributes:
        num_workers: worker processes.
        pin_workers: whether workers were pinned to one CPU each.
        samples_per_s: samples (images) per second over the timed batches (wall clock).
        cpu_percent: CPU time of this process tree over the timed batches divided by their wall
            time, in percent (200.0 = two cores busy).
        peak_memory_bytes: peak PSS of this process tree (bytes) while the loader lived, from
            :class:`gpufeed._observe.memory.PeakPSS`.
        memory_per_worker_bytes: mean PSS of the loader's worker processes (bytes), each at its
            largest during the timed batches; shared pages (the arena) count 1/n per process.
            For loaders without ``worker_pids()`` (torch's DataLoader): (peak PSS - PSS before
            the loader was built) / num_workers.
        data_wait_fraction: share of the timed wall time spent waiting in ``next()`` (0-1).
            Without a ``step`` the consumer does nothing, so this is close to 1 by construction.
        read_concurrency: the image dataset's reads in flight per worker during the measurement
            (None: the dataset has no such option).
        read_fraction: share of the workers' stage time spent reading over the timed batches,
            from the loader's ``stats()`` (0-1; None: not the image path).
        read_latency_s: mean duration of one read of the source (seconds), each timed on the
            thread that read (None: no reads timed).
        decode_per_sample_s: the workers' stage seconds per sample with reads left out
            (seconds; None: no reads timed).
        batch_samples: mean samples per timed batch.
    """

    num_workers: int
    pin_workers: bool
    samples_per_s: float
    cpu_percent: float
    peak_memory_bytes: int
    memory_per_worker_bytes: int
    data_wait_fraction: float
    read_concurrency: int | None = None
    read_fraction: float | None = None
    read_latency_s: float | None = None
    decode_per_sample_s: float | None = None
    batch_samples: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-able data."""
        return asdict(self)

    @property
    def base_memory_bytes(self) -> int:
        """Peak PSS of the tree less its workers' share (bytes): the main process and helpers."""
        return self.peak_memory_bytes - max(self.num_workers, 1) * self.memory_per_worker_bytes
