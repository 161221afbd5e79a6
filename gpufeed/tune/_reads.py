"""Read concurrency in :func:`gpufeed.tune.tune`: what a measurement saw of reads, and the search.

A measurement's read share comes from the loader's own stage timings (``FastLoader.stats()``,
image path). When reads dominate the one-worker baseline (slow storage: NFS, object stores,
a slow wrapped dataset), :func:`tune_reads` steps the dataset's ``read_concurrency`` through
:data:`gpufeed._observe.rules.READ_CONCURRENCIES` before the worker counts are measured:
reads in flight cost threads, workers cost processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpufeed._observe.rules import (
    READ_CONCURRENCIES,
    reads_ahead,
    reads_dominate,
    search_read_concurrency,
)
from gpufeed.errors import is_int

__all__ = ["prefetch_for_reads", "read_concurrency_of", "read_fraction", "read_options", "read_timing", "stage_seconds",
           "tune_reads"]

_STAGE_KEYS = ("read_s", "decode_s", "transform_s", "collate_s", "pack_s")
_READ_KEYS = ("reads", "read_latency_s", "samples", "parent_batches")  # with the stages: timing


def stage_seconds(loader: Any) -> dict[str, float] | None:
    """The image path's per-stage worker seconds so far (None: no stats, or the generic path)."""
    stats = getattr(loader, "stats", None)
    if not callable(stats):
        return None
    snapshot = stats()
    if "images" not in snapshot:
        return None
    return {k: float(snapshot.get(k, 0.0) or 0.0) for k in _STAGE_KEYS + _READ_KEYS}


def read_timing(before: dict[str, float] | None, after: dict[str, float] | None,
                ) -> tuple[float, float] | None:
    """(mean seconds per read, a worker's stage seconds per sample with reads left out) between
    two :func:`stage_seconds`; None without timed reads (or with batches the main process made
    from the cache, which have no stage seconds)."""
    if before is None or after is None:
        return None
    spent = {k: after[k] - before[k] for k in _STAGE_KEYS + _READ_KEYS}
    if spent["reads"] <= 0 or spent["samples"] <= 0 or spent["parent_batches"] > 0:
        return None
    decode_s = sum(spent[k] for k in _STAGE_KEYS) - spent["read_s"]
    return spent["read_latency_s"] / spent["reads"], max(0.0, decode_s) / spent["samples"]


def read_fraction(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Share of the worker stage seconds between two :func:`stage_seconds` spent reading."""
    if before is None or after is None:
        return None
    spent = {k: after[k] - before[k] for k in _STAGE_KEYS}
    total = sum(spent.values())
    return min(1.0, max(0.0, spent["read_s"] / total)) if total > 0 else None


def read_concurrency_of(dataset: Any) -> int | None:
    """The dataset's ``read_concurrency`` (None: it has none)."""
    value = getattr(dataset, "read_concurrency", None)
    return value if is_int(value) else None


def read_options(dataset: Any) -> tuple[int | None, int] | None:
    """(read_concurrency, read_budget_bytes) of a dataset that can change them, else None;
    read_concurrency is None when automatic (``read_auto``), as ``set_read_options`` takes it."""
    rc = read_concurrency_of(dataset)
    if rc is None or not callable(getattr(dataset, "set_read_options", None)):
        return None
    return (None if getattr(dataset, "read_auto", False) else rc), int(dataset.read_budget_bytes)


def tune_reads(dataset: Any, measure_at: Callable[[int], Any], baseline: Any, min_gain: float,
               progress: Any, concurrencies: tuple[int, ...] = READ_CONCURRENCIES,
               ) -> tuple[Any, list[Any], list[str]]:
    """When reads dominate ``baseline`` (a ``TuneRow``), measure the dataset at more reads in
    flight (``measure_at(read_concurrency)``, with the dataset set to it) while each step gains
    ``min_gain``; leave the dataset at the best value. Returns (best row, rows, reasons).
    ``progress``: the search's bar (``grow``, ``start``, ``done``); ``concurrencies``: the
    values tried (those above the baseline's)."""
    share = "-" if baseline.read_fraction is None else f"{baseline.read_fraction:.0%}"
    if not reads_dominate(baseline.read_fraction):
        return baseline, [], [f"reading is {share} of worker time: read_concurrency stays at "
                              f"{baseline.read_concurrency} (not measured)."]
    tries = sorted(c for c in concurrencies if c > (baseline.read_concurrency or 1))
    if not tries:
        return baseline, [], [f"reading is {share} of worker time; no read_concurrency above "
                              f"{baseline.read_concurrency} to try."]
    reasons = [f"reading is {share} of worker time: measuring read_concurrency "
               f"{', '.join(map(str, tries))} (threads) before more workers (processes)."]
    progress.grow(len(tries))
    budget = int(dataset.read_budget_bytes)

    def at(concurrency: int) -> Any:
        dataset.set_read_options(concurrency, budget)
        progress.start(f"{baseline.num_workers} worker, {concurrency} reads")
        try:
            return measure_at(concurrency)
        finally:
            progress.done()

    best, rows, why = search_read_concurrency(at, baseline, min_gain, tuple(tries))
    dataset.set_read_options(best.read_concurrency or 1, budget)
    reasons += why
    if (best.read_concurrency or 1) > 1 and getattr(dataset, "_source", None) is not None:
        reasons.append("read_concurrency > 1 calls the wrapped dataset's __getitem__ from "
                       "several threads at once: it must be thread-safe.")
    return best, rows, reasons


def prefetch_for_reads(row: Any, prefetch: int, why: str) -> tuple[int, str]:
    """``prefetch_factor`` and why: ``prefetch`` (from the data wait), raised when the reads of
    ``row`` (a ``TuneRow``) outlast the decode of the tasks a worker holds
    ahead (:func:`gpufeed._observe.rules.reads_ahead`): reads run ahead only within them."""
    if row.read_latency_s is None or not row.decode_per_sample_s or not row.batch_samples:
        return prefetch, why
    rule = reads_ahead(row.read_latency_s, row.decode_per_sample_s, row.batch_samples,
                       row.read_concurrency or 1)
    covered = min(rule.needed, row.read_concurrency or 1)
    need = max(2, 1 + math.ceil(covered / row.batch_samples))  # at the read_concurrency measured
    if need <= prefetch:
        return prefetch, why
    per_batch_ms = row.decode_per_sample_s * row.batch_samples * 1e3
    return need, (f"prefetch_factor {need}: a read takes {row.read_latency_s * 1e3:.0f} ms and a "
                  f"worker decodes a batch in {per_batch_ms:.0f} ms, so {covered} reads in flight "
                  f"per worker need {need - 1} held task{'s' if need > 2 else ''} ahead (reads "
                  f"run ahead only within the tasks a worker holds; {why})")
