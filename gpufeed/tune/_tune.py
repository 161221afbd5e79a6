"""Find a good ``num_workers`` (and ``read_concurrency``, ``pin_workers``, ``prefetch_factor``,
``cache_bytes``) by measuring (the code; documented in ``gpufeed.tune``, which re-exports it)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import psutil

from gpufeed._engine.context import usable_cores
from gpufeed._observe.batches import batch_size_of, doublings
from gpufeed._observe.memory import PeakPSS, format_bytes, process_pss_bytes
from gpufeed._observe.rules import (
    READ_CONCURRENCIES,
    cache_bytes_needed,
    recommend_cache_bytes,
    recommend_prefetch_factor,
    search_read_concurrency,
)
from gpufeed._observe.rules import gain as relative_gain
from gpufeed._progress import ProgressBar
from gpufeed.errors import check_int, is_int, shorten
from gpufeed.loader import FastLoader
from gpufeed.tune._plot import save_tune_plot
from gpufeed.tune._reads import (
    prefetch_for_reads,
    read_concurrency_of,
    read_fraction,
    read_options,
    read_timing,
    stage_seconds,
)
from gpufeed.tune._row import TuneRow
from gpufeed.tune._search import Search, host_limits

__all__ = [
    "READ_CONCURRENCIES",
    "TuneResult",
    "TuneRow",
    "cache_bytes_needed",
    "measure",
    "recommend_cache_bytes",
    "recommend_prefetch_factor",
    "search_read_concurrency",
    "tree_cpu_s",
    "tune",
    "usable_cores",
    "worker_counts",
]

logger = logging.getLogger("gpufeed.tune")  # the public module's name, which users configure

LoaderFactory = Callable[[int, bool], "FastLoader"]
MeasureFn = Callable[[int, bool], "TuneRow"]

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ProcessLookupError)


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and all its descendants so far.

    Live descendants are read with psutil; descendants that exited and were reaped by this
    process are in ``os.times()``'s children fields, so a worker that exits between two readings
    is still counted. (Grandchildren reaped by a live child are missed until that child is reaped.)
    """
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        children = psutil.Process().children(recursive=True)
    except _GONE:
        children = []
    for child in children:
        try:
            c = child.cpu_times()
        except _GONE:
            continue
        total += c.user + c.system
    return total


def _batches(loader: Any) -> Generator[Any, None, None]:
    """The loader's batches, epoch after epoch, forever (a loader with no batches: ValueError)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yielded no batches; check the dataset and batch_size")


def _sample_workers(loader: Any, peaks: dict[int, int]) -> None:
    """Raise ``peaks[pid]`` to the current PSS (bytes) of each of ``loader``'s workers."""
    pids = getattr(loader, "worker_pids", None)
    for pid in pids() if callable(pids) else ():
        try:
            nbytes, _ = process_pss_bytes(pid)
        except _GONE:
            continue
        peaks[pid] = max(peaks.get(pid, 0), nbytes)


def measure(
    make_loader: LoaderFactory,
    num_workers: int,
    pin_workers: bool = False,
    *,
    batches: int = 20,
    warmup_batches: int = 3,
    step: Callable[[Any], Any] | None = None,
    sample_interval_s: float = 0.2,
) -> TuneRow:
    """Measure one loader: ``make_loader(num_workers, pin_workers)``.

    Runs ``warmup_batches`` untimed batches (worker start-up, first decodes), then ``batches``
    timed ones, calling ``step(batch)`` after each when given (your training step, or a stand-in
    such as ``time.sleep``); epochs restart as needed. The tree's PSS is sampled every
    ``sample_interval_s`` seconds from before the loader is built until after it is closed (each
    sample walks /proc, a few ms of CPU, so not too often: that CPU is in ``cpu_percent`` too);
    the workers' own PSS after the warm-up, mid-way (not timed) and at the end. The loader is
    closed before returning.
    """
    for name, value, low in (("num_workers", num_workers, 0), ("batches", batches, 1),
                             ("warmup_batches", warmup_batches, 0)):
        check_int(name, value, low)
    with PeakPSS(interval_s=sample_interval_s) as mem:
        loader = make_loader(num_workers, pin_workers)
        try:
            stream = _batches(loader)
            for _ in range(warmup_batches):
                batch = next(stream)
                if step is not None:
                    step(batch)
                del batch
            samples = 0
            wait_s = 0.0
            worker_pss: dict[int, int] = {}
            _sample_workers(loader, worker_pss)
            stats0 = stage_seconds(loader)
            sampling_s = 0.0  # the mid-run worker sample, left out of the timed wall time
            cpu0 = tree_cpu_s()
            t0 = time.perf_counter()
            for i in range(batches):
                tw = time.perf_counter()
                batch = next(stream)
                wait_s += time.perf_counter() - tw
                samples += batch_size_of(batch)
                if step is not None:
                    step(batch)
                del batch
                if i == batches // 2:
                    ts = time.perf_counter()
                    _sample_workers(loader, worker_pss)
                    sampling_s += time.perf_counter() - ts
            elapsed_s = time.perf_counter() - t0 - sampling_s
            cpu_s = tree_cpu_s() - cpu0
            stats1 = stage_seconds(loader)
            read_share = read_fraction(stats0, stats1)
            timing = read_timing(stats0, stats1)
            _sample_workers(loader, worker_pss)
            stream.close()
        finally:
            close = getattr(loader, "close", None)
            if close is not None:
                close()
    if worker_pss:
        per_worker = sum(worker_pss.values()) / len(worker_pss)
    else:
        per_worker = max(0, mem.peak_bytes - mem.baseline_bytes) / max(num_workers, 1)
    row = TuneRow(
        num_workers=num_workers,
        pin_workers=bool(pin_workers),
        samples_per_s=samples / elapsed_s if elapsed_s > 0 else 0.0,
        cpu_percent=100.0 * cpu_s / elapsed_s if elapsed_s > 0 else 0.0,
        peak_memory_bytes=int(mem.peak_bytes),
        memory_per_worker_bytes=int(per_worker),
        data_wait_fraction=min(1.0, wait_s / elapsed_s) if elapsed_s > 0 else 0.0,
        read_concurrency=read_concurrency_of(getattr(loader, "dataset", None)),
        read_fraction=read_share,
        read_latency_s=None if timing is None else timing[0],
        decode_per_sample_s=None if timing is None else timing[1],
        batch_samples=samples / batches,
    )
    logger.debug("measured %s", row)
    return row


# ---------------------------------------------------------------------------------- result

@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` measured and recommends.

    ``rows`` are in measurement order (the pinned measurement, if any, last).
    ``recommended_prefetch_factor``: see :func:`recommend_prefetch_factor`;
    ``recommended_cache_bytes``: see :func:`recommend_cache_bytes` (0: no cache).
    ``knee_num_workers``: the first count whose gain fell under ``min_gain`` (None: not reached).
    ``recommended_read_concurrency``: the image dataset's reads in flight per worker (measured
    when reads dominated the baseline, else the dataset's own value; None: no such option).
    ``reasons``: one line per decision, in order. Memory figures are bytes.
    ``local_ranks``: the ranks sharing the host; above 1, ``recommended_num_workers`` (and
    every figure) is per rank, for that many ranks.
    """

    rows: tuple[TuneRow, ...]
    recommended_num_workers: int
    recommended_pin_workers: bool
    recommended_prefetch_factor: int
    recommended_cache_bytes: int
    reasons: tuple[str, ...]
    knee_num_workers: int | None = None
    max_workers: int = 0
    min_gain: float = 0.05
    memory_fraction: float = 0.8
    available_memory_bytes: int = 0
    dataset_cache_bytes: int | None = None
    recommended_read_concurrency: int | None = None
    local_ranks: int = 1

    @property
    def recommended_row(self) -> TuneRow:
        """The measurement at the recommended settings."""
        for row in self.rows:
            if (row.num_workers, row.pin_workers, row.read_concurrency) == (
                    self.recommended_num_workers, self.recommended_pin_workers,
                    self.recommended_read_concurrency):
                return row
        raise LookupError("no row at the recommended settings")  # not reachable from tune()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the recommendations, the search settings, ``reasons`` and ``rows``."""
        return {
            "recommended_num_workers": self.recommended_num_workers,
            "recommended_pin_workers": self.recommended_pin_workers,
            "recommended_prefetch_factor": self.recommended_prefetch_factor,
            "recommended_cache_bytes": self.recommended_cache_bytes,
            "recommended_read_concurrency": self.recommended_read_concurrency,
            "local_ranks": self.local_ranks,
            "knee_num_workers": self.knee_num_workers,
            "max_workers": self.max_workers,
            "min_gain": self.min_gain,
            "memory_fraction": self.memory_fraction,
            "available_memory_bytes": self.available_memory_bytes,
            "dataset_cache_bytes": self.dataset_cache_bytes,
            "reasons": list(self.reasons),
            "rows": [_finite_row(r.to_dict()) for r in self.rows],
        }

    def format_table(self) -> str:
        """A text table: workers, reads in flight, pin, images/s, gain, CPU %, memory, per worker,
        data wait, read share."""
        header = ("", "workers", "reads", "pin", "images/s", "gain", "CPU %", "memory",
                  "per worker", "data wait", "read")
        lines: list[list[str]] = []
        previous: TuneRow | None = None
        for row in self.rows:
            if row.pin_workers:
                ref = next((r for r in self.rows if not r.pin_workers
                            and r.num_workers == row.num_workers), None)
            else:
                ref, previous = previous, row
            step = "" if ref is None else f"{relative_gain(ref.samples_per_s, row.samples_per_s):+.1%}"
            mark = "*" if row == self.recommended_row else ""
            lines.append([mark, f"{row.num_workers}",
                          "-" if row.read_concurrency is None else f"{row.read_concurrency}",
                          "yes" if row.pin_workers else "no",
                          f"{row.samples_per_s:.0f}", step, f"{row.cpu_percent:.0f}",
                          format_bytes(row.peak_memory_bytes),
                          format_bytes(row.memory_per_worker_bytes),
                          f"{row.data_wait_fraction:.0%}",
                          "-" if row.read_fraction is None else f"{row.read_fraction:.0%}"])
        widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h)
                  for i, h in enumerate(header)]
        # the recommended mark has its own first column, so every row keeps the same alignment
        out = [" ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))]
        out += [" ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                for r in lines]
        out.append("(* recommended; gain: over the previous row, or over unpinned for pin=yes; "
                   "reads: read_concurrency; read: share of worker time reading)")
        return "\n".join(out)

    def save_plot(self, path: str | os.PathLike) -> bool:
        """Write images/s and memory against num_workers as a PNG at ``path``.

        Returns True when written, False (and logs why) when matplotlib is not installed.
        """
        return save_tune_plot(self.rows, self.recommended_num_workers, path)


def _finite_row(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


# ---------------------------------------------------------------------------------- rules

def worker_counts(max_workers: int) -> list[int]:
    """1, 2, 4, ... below ``max_workers``, then ``max_workers`` itself: e.g. 6 -> [1, 2, 4, 6]."""
    if max_workers < 1:
        raise ValueError(f"`max_workers` must be >= 1. Found: {shorten(max_workers)}.")
    return doublings(max_workers)


# ---------------------------------------------------------------------------------- search

def tune(
    make_loader: LoaderFactory | None = None,
    *,
    dataset: Any = None,
    batch_size: int = 64,
    max_workers: int | None = None,
    memory_fraction: float = 0.8,
    min_gain: float = 0.05,
    batches: int = 20,
    warmup_batches: int = 3,
    step: Callable[[Any], Any] | None = None,
    measure_fn: MeasureFn | None = None,
    available_memory_bytes: int | None = None,
    progress: bool = True,
    read_concurrencies: tuple[int, ...] = READ_CONCURRENCIES,
    local_ranks: int | None = None,
    **loader_kwargs: Any,
) -> TuneResult:
    """Search ``num_workers`` 1, 2, 4, 8, ... for the knee; back off one step; under a memory ceiling.

    What is measured, one of:
        make_loader: ``(num_workers, pin_workers) -> FastLoader``, built fresh per measurement;
        dataset: loaders ``FastLoader(dataset, batch_size=..., num_workers=n, pin_workers=p,
            persistent_workers=True, **loader_kwargs)``;
        measure_fn: ``(num_workers, pin_workers) -> TuneRow`` instead of :func:`measure` (a
            cost model in tests); ``dataset`` may still be given for the cache rule.

    The search:
        1. ``max_workers`` defaults to :func:`usable_cores` (affinity, cgroup quota); a larger
           value is honoured when given explicitly. Counts: :func:`worker_counts`.
           When reading is at least 40% of the one-worker baseline's stage time and the dataset
           has a ``read_concurrency`` (gpufeed image sources), first step it through 4, 16, 64
           at one worker while each step gains ``min_gain`` (:func:`search_read_concurrency`);
           the worker counts are then measured at the chosen value. The dataset's own setting
           is restored at the end; the choice is ``recommended_read_concurrency``.
           ``read_concurrencies``: the values tried (``()``: workers only).
        2. Before each count n > 1: stop if the projected memory, the baseline's tree memory
           without its worker (:attr:`TuneRow.base_memory_bytes`) plus n x the largest
           per-worker memory measured so far, exceeds
           ``memory_fraction`` x available memory (``psutil.virtual_memory().available`` at the
           start, or ``available_memory_bytes``).
        3. After each count: the gain over the previous count; under ``min_gain`` (or negative)
           this count is the knee: stop and recommend the previous count.
        4. At the recommended count, measure ``pin_workers=True``; recommend it only when it is
           at least ``min_gain`` faster.
        5. ``prefetch_factor`` and ``cache_bytes``: :func:`recommend_prefetch_factor`,
           :func:`recommend_cache_bytes`.

    Many ranks on one host: ``local_ranks`` W (default: ``LOCAL_WORLD_SIZE`` or the process
    group, as a loader finds them; 1 when nothing says) makes every figure per rank for W ranks:
    ``max_workers`` defaults to ``max(1, usable_cores // W - 1)``, so that W x (workers + one
    main process) stays within the host's cores, and each rank's memory ceiling is 1/W of
    ``memory_fraction`` x available memory. Run under torchrun, every rank measures at once.

    ``batches``, ``warmup_batches`` and ``step`` go to :func:`measure`. ``progress``: a tqdm bar
    on stderr when tqdm is installed and stderr is a terminal.
    """
    _check_tune_args(make_loader, dataset, measure_fn, loader_kwargs, memory_fraction, min_gain,
                     read_concurrencies)
    host = host_limits(usable_cores(), max_workers, local_ranks, memory_fraction, available_memory_bytes)
    seen: dict[str, Any] = {}
    run = measure_fn or _measuring(make_loader, dataset, batch_size, loader_kwargs, seen,
                                   dict(batches=batches, warmup_batches=warmup_batches, step=step))
    counts = worker_counts(host.max_workers)
    search = Search(run, min_gain, host, ProgressBar(len(counts) + 1, progress))
    search.reasons += host.reasons
    restore: tuple[Any, tuple[int | None, int]] | None = None  # the dataset's own read options
    auto = read_options(dataset) if measure_fn is None and read_concurrencies else None
    if auto is not None and auto[0] is None:  # automatic: measured at 1 read, so rows say what ran
        restore = (dataset, auto)
        dataset.set_read_options(1, auto[1])
    try:
        tune_reads_at = None if measure_fn is not None or not read_concurrencies else tuple(read_concurrencies)
        changed = search.counts(counts, lambda: dataset if dataset is not None else seen.get("dataset"),
                                tune_reads_at)
        restore = restore or changed
        recommended, pin = search.pinned()
    finally:
        search.bar.close()
        if restore is not None:  # the dataset's own setting, as it was before the search
            restore[0].set_read_options(*restore[1])
    cache_dataset = dataset if dataset is not None else seen.get("dataset")
    return _result(search, recommended, pin, cache_dataset)


def _check_tune_args(make_loader: Any, dataset: Any, measure_fn: Any, loader_kwargs: dict[str, Any],
                     memory_fraction: float, min_gain: float, read_concurrencies: tuple[int, ...]) -> None:
    if measure_fn is None and (make_loader is None) == (dataset is None):
        raise TypeError("tune() needs exactly one of `make_loader` or `dataset` (or `measure_fn`).")
    if measure_fn is not None and make_loader is not None:
        raise TypeError("tune() takes `measure_fn` or `make_loader`, not both.")
    if loader_kwargs and (dataset is None or make_loader is not None or measure_fn is not None):
        raise TypeError(f"loader options {sorted(loader_kwargs)} apply with `dataset=` only.")
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"`memory_fraction` must be in (0, 1]. Found: {shorten(memory_fraction)}.")
    if not 0 <= min_gain < 10:
        raise ValueError(f"`min_gain` must be a fraction >= 0 (0.05 = 5%). Found: {shorten(min_gain)}.")
    if any(not is_int(c) or c < 1 for c in read_concurrencies):
        raise ValueError(f"`read_concurrencies` must be ints >= 1. Found: {shorten(read_concurrencies)}.")


def _measuring(make_loader: LoaderFactory | None, dataset: Any, batch_size: int,
               loader_kwargs: dict[str, Any], seen: dict[str, Any],
               measure_kwargs: dict[str, Any]) -> MeasureFn:
    """``(num_workers, pin_workers) -> TuneRow`` by :func:`measure`; the first loader's dataset
    goes to ``seen["dataset"]``."""
    factory = make_loader if make_loader is not None else _dataset_factory(dataset, batch_size, loader_kwargs)

    def recording(num_workers: int, pin_workers: bool) -> FastLoader:
        loader = factory(num_workers, pin_workers)
        seen.setdefault("dataset", getattr(loader, "dataset", None))
        return loader

    def run_measure(num_workers: int, pin_workers: bool) -> TuneRow:
        return measure(recording, num_workers, pin_workers, **measure_kwargs)

    return run_measure


def _result(search: Search, recommended: TuneRow, pin: bool, cache_dataset: Any) -> TuneResult:
    """Step 5, and the result."""
    host, reasons = search.host, search.reasons
    prefetch, why = recommend_prefetch_factor(recommended.data_wait_fraction)
    prefetch, why = prefetch_for_reads(recommended, prefetch, why)
    reasons.append(why + ".")
    needed, what = cache_bytes_needed(cache_dataset) if cache_dataset is not None else (
        None, "the dataset is unknown (pass dataset=)")
    loader_bytes = recommended.peak_memory_bytes - recommended.base_memory_bytes
    cache_bytes, why = recommend_cache_bytes(needed, what, host.available_memory_bytes, loader_bytes)
    reasons.append(why + ".")
    if host.local_ranks > 1:
        n, w = recommended.num_workers, host.local_ranks
        reasons.append(f"num_workers={n} is per rank, for {w} local ranks: {w} x {n} = {w * n} "
                       f"workers and {w} main processes on the host's {host.cores} usable cores.")
    return TuneResult(
        rows=tuple(search.rows),
        recommended_num_workers=recommended.num_workers,
        recommended_pin_workers=pin,
        recommended_prefetch_factor=prefetch,
        recommended_cache_bytes=cache_bytes,
        reasons=tuple(reasons),
        knee_num_workers=search.knee,
        max_workers=host.max_workers,
        min_gain=search.min_gain,
        memory_fraction=host.memory_fraction,
        available_memory_bytes=host.available_memory_bytes,
        dataset_cache_bytes=needed,
        recommended_read_concurrency=recommended.read_concurrency,
        local_ranks=host.local_ranks,
    )


def _dataset_factory(dataset: Any, batch_size: int, loader_kwargs: dict[str, Any]) -> LoaderFactory:
    def make(num_workers: int, pin_workers: bool) -> FastLoader:
        kwargs = dict(loader_kwargs)
        kwargs.setdefault("persistent_workers", num_workers > 0)
        return FastLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                          pin_workers=pin_workers, **kwargs)

    return make
