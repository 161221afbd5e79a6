"""The rules behind :func:`gpufeed.tune.tune`'s ``read_concurrency``, ``prefetch_factor`` and
``cache_bytes`` advice.

Functions of measured figures (and, for the cache, of the dataset's size), so each rule can be
read, tested and changed on its own; :func:`search_read_concurrency` takes the measuring
function it steps through. Re-exported by :mod:`gpufeed.tune`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufeed._observe.memory import format_bytes
from gpufeed.image._fill import base_source
from gpufeed.sources import ImageFolder, ImageSource, LMDBDataset

__all__ = ["READ_CONCURRENCIES", "ReadsAhead", "cache_bytes_needed", "reads_ahead", "reads_dominate",
           "recommend_cache_bytes", "recommend_prefetch_factor", "search_read_concurrency"]

#: data_wait_fraction at or above which the loader is slower than the consumer on average (or no
#: step was measured): stalls from jitter alone, with 2 batches per worker queued, stay well below.
LOADER_BOUND_WAIT = 0.3
#: data_wait_fraction at or above which (and below LOADER_BOUND_WAIT) stalls are jitter.
JITTER_WAIT = 0.05
#: Share of the memory left after the loader that a whole-dataset cache may take.
CACHE_FRACTION = 0.5
#: Share of the workers' stage time spent reading at or above which reads dominate (as the
#: doctor's "read" verdict): then read concurrency is measured before more workers.
READS_DOMINATE = 0.4
#: Reads in flight per worker that :func:`search_read_concurrency` tries, in order.
READ_CONCURRENCIES = (1, 4, 16, 64)
#: The most reads in flight per worker :func:`reads_ahead` proposes (threads).
MAX_READ_CONCURRENCY = 256


@dataclass(frozen=True)
class ReadsAhead:
    """What hiding a read's latency behind a worker's decode takes (see :func:`reads_ahead`)."""

    needed: int  # reads in flight per worker that keep it decoding
    read_concurrency: int  # the read_concurrency that allows them (the one given if enough)
    prefetch_factor: int  # the prefetch_factor whose held tasks hold them (at least 2)


def reads_ahead(latency_s: float, decode_per_sample_s: float, batch_size: float,
                read_concurrency: int) -> ReadsAhead:
    """From the measured read latency L (seconds per read) and a worker's decode time per
    sample b (its stage seconds, reads left out): while one read is out a worker decodes L / b
    samples, so that many reads must be in flight; at most ``read_concurrency`` are (raised to
    the next power of two, up to ``MAX_READ_CONCURRENCY``, when short), and only reads of the
    tasks the worker holds: the newest task arrives when the oldest is handed out, about
    (prefetch_factor - 1) batches of decode before it is needed, so prefetch_factor must reach
    1 + ceil(reads in flight / batch_size). Measured (benchmarks/latency.py, 100 ms per read,
    46 ms of decode per batch of 32): 70 reads, prefetch_factor 4; 0.79-0.83x the local-disk
    rate at 4 against 0.52-0.61x at 2."""
    needed = max(1, math.ceil(latency_s / decode_per_sample_s)) if decode_per_sample_s > 0 else 1
    rc = read_concurrency
    if rc < needed:
        rc = max(rc, min(MAX_READ_CONCURRENCY, 1 << (needed - 1).bit_length()))
    batch = max(batch_size, 1.0)
    return ReadsAhead(needed, rc, max(2, 1 + math.ceil(min(needed, rc) / batch)))


def gain(before: float, after: float) -> float:
    """Relative gain of ``after`` over ``before`` (inf from a zero baseline that rose)."""
    if before > 0:
        return after / before - 1.0
    return math.inf if after > 0 else 0.0


def reads_dominate(read_fraction: float | None) -> bool:
    """Whether reading takes at least :data:`READS_DOMINATE` of the workers' stage time (None:
    not measured, e.g. a generic dataset: False)."""
    return read_fraction is not None and read_fraction >= READS_DOMINATE


def search_read_concurrency(measure_at: Callable[[int], Any], baseline: Any, min_gain: float,
                            concurrencies: tuple[int, ...] = READ_CONCURRENCIES,
                            ) -> tuple[Any, list[Any], list[str]]:
    """Step read concurrency through ``concurrencies`` above the baseline's, at the baseline's
    worker count, while each step gains at least ``min_gain``.

    ``baseline`` and what ``measure_at(read_concurrency)`` returns are rows with
    ``samples_per_s`` and ``read_concurrency`` (:class:`gpufeed.tune.TuneRow`). Returns (the
    best row, the rows measured, one reason per step); stops at the first step under
    ``min_gain`` (the knee: more reads in flight no longer help, e.g. the decode is now the
    limit) and keeps the previous value.
    """
    best, rows, reasons = baseline, [], []
    start = baseline.read_concurrency or 1
    for concurrency in sorted(concurrencies):
        if concurrency <= start:
            continue
        row = measure_at(concurrency)
        rows.append(row)
        step = gain(best.samples_per_s, row.samples_per_s)
        if step < min_gain:
            reasons.append(f"read_concurrency {concurrency}: {row.samples_per_s:.0f} images/s, "
                           f"{step:+.1%} over {best.read_concurrency or 1} reads in flight, less "
                           f"than the {min_gain:.0%} a step must gain: more reads in flight "
                           f"stopped helping; keeping {best.read_concurrency or 1}.")
            break
        reasons.append(f"read_concurrency {concurrency}: {row.samples_per_s:.0f} images/s, "
                       f"{step:+.1%} over {best.read_concurrency or 1} reads in flight, at least "
                       f"the {min_gain:.0%} a step must gain: more reads in flight still help.")
        best = row
    return best, rows, reasons


def recommend_prefetch_factor(data_wait_fraction: float) -> tuple[int, str]:
    """``prefetch_factor`` from the consumer's data wait at the recommended count, and why.

    - wait >= 0.3: the loader is slower than the consumer on average (without a training
      ``step`` the consumer does nothing and always waits, which reads the same): a queue drains
      whatever its depth, so a deeper one cannot raise throughput; keep torch's 2 (more only holds
      more batches in memory); more workers, the cache or cheaper decoding help instead.
    - 0.05 <= wait < 0.3: stalls of that size, with the workers at the knee, are mostly jitter
      (slow files, a worker descheduled); 4 batches per worker absorb the bursts.
    - wait < 0.05: the consumer rarely waits; 2.

    The 0.3 line is a heuristic: the wait fraction alone cannot tell a small throughput shortfall
    from jitter.
    """
    if data_wait_fraction >= LOADER_BOUND_WAIT:
        return 2, (f"prefetch_factor 2: the consumer waited {data_wait_fraction:.0%} of the time, "
                   "so the loader is slower than the consumer on average (or no training step was "
                   "measured); a deeper queue would not raise throughput")
    if data_wait_fraction >= JITTER_WAIT:
        return 4, (f"prefetch_factor 4: the consumer waited {data_wait_fraction:.0%} of the "
                   "time, stalls of the size jitter causes; a deeper queue absorbs them")
    return 2, (f"prefetch_factor 2: the consumer waited only {data_wait_fraction:.0%} of the time")


def cache_bytes_needed(dataset: Any) -> tuple[int | None, str]:
    """Bytes the loader's host cache needs to hold all of ``dataset``, and what they are.

    The cache holds what the image path would recompute (see :mod:`gpufeed.cache`): with a
    deterministic transform (``ResizeCenterCrop``) the decoded output rows, ``len x H x W x 3``;
    with a random one (``RandomResizedCrop``) the encoded bytes: the files' sizes for an
    ``ImageFolder``, the database file for an ``LMDBDataset``, otherwise the mean size of up to
    256 samples (32 for an ``ImageFolder`` over a URL) read evenly across the dataset times its
    length. A ``Subset`` of one (``random_split``'s) needs its share: the base dataset's bytes
    times the Subset's fraction of its samples. None: not an image dataset with a transform
    (no fast path, so no cache).
    """
    base = base_source(dataset)
    if base is not dataset and isinstance(base, ImageSource):
        needed, what = cache_bytes_needed(base)
        if needed is None or len(base) == 0:
            return needed, what
        return needed * len(dataset) // len(base), f"a Subset of {len(dataset)} of the {what}"
    transform = getattr(dataset, "transform", None)
    if not isinstance(dataset, ImageSource) or transform is None:
        return None, "cache_bytes applies to gpufeed image datasets with a transform only"
    count = len(dataset)
    if getattr(transform, "deterministic", False):
        h, w = transform.output_size
        return count * h * w * 3, f"{count} decoded {h}x{w} rows"
    if isinstance(dataset, ImageFolder) and getattr(dataset, "remote", None) is None:
        total = sum(os.stat(dataset.path(i)).st_size for i in range(count))
        return total, f"{count} encoded files"
    if isinstance(dataset, LMDBDataset):
        if os.path.isdir(dataset.path):
            total = sum(e.stat().st_size for e in os.scandir(dataset.path)
                        if e.is_file() and e.name.endswith(".mdb") and e.name != "lock.mdb")
        else:
            total = os.path.getsize(dataset.path)
        return total, f"{count} encoded images in the LMDB"
    if count == 0:
        return 0, "an empty dataset"
    k = 32 if isinstance(dataset, ImageFolder) else 256  # an ImageFolder here is remote: slow reads
    picks = sorted({int(i * count / min(count, k)) for i in range(min(count, k))})
    mean = sum(len(dataset.read(i)) for i in picks) / len(picks)
    return int(mean * count), f"{count} encoded images (estimated from {len(picks)} reads)"


def recommend_cache_bytes(needed_bytes: int | None, what: str, available_bytes: int,
                          loader_bytes: int) -> tuple[int, str]:
    """``cache_bytes`` for the loader, and why: all of the dataset or nothing.

    The whole dataset (``needed_bytes``, from :func:`cache_bytes_needed`) is cached when it fits
    in ``CACHE_FRACTION`` (half) of the memory left once the loader itself is running
    (``available_bytes - loader_bytes``); then every epoch after the first reads no file and, for
    a deterministic transform, decodes nothing. Otherwise 0: with a shuffled order an LRU smaller
    than the dataset hits only about cache/dataset of the time, at a fixed memory cost that is
    usually better spent on workers or the page cache.
    """
    if needed_bytes is None:
        return 0, f"cache_bytes 0: {what}"
    room = max(0, available_bytes - loader_bytes)
    if needed_bytes <= CACHE_FRACTION * room:
        return needed_bytes, (f"cache_bytes {format_bytes(needed_bytes)}: the "
                              f"whole dataset ({what}) fits in {CACHE_FRACTION:.0%} of the "
                              f"{format_bytes(room)} left after the loader")
    return 0, (f"cache_bytes 0: the dataset ({what}, {format_bytes(needed_bytes)}) does not fit in "
               f"{CACHE_FRACTION:.0%} of the {format_bytes(room)} left after the loader; a "
               "partial LRU cache would mostly miss")
