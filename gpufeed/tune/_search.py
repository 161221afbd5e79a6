"""The worker-count search of :func:`gpufeed.tune.tune`: the limits it works within (per rank
when several local ranks share the host) and its steps, each adding its rows and reasons."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from gpufeed._engine.ranks import find_local_ranks, fitting_workers
from gpufeed._observe.memory import format_bytes
from gpufeed._observe.rules import gain as relative_gain
from gpufeed._progress import ProgressBar
from gpufeed.errors import check_int
from gpufeed.tune._reads import read_options, tune_reads
from gpufeed.tune._row import TuneRow

MeasureFn = Callable[[int, bool], TuneRow]


@dataclass(frozen=True)
class HostLimits:
    """What the search may use: per rank when ``local_ranks`` > 1 (bytes, cores)."""

    cores: int  # usable cores of this process (the host's, for its local ranks)
    local_ranks: int
    max_workers: int
    memory_fraction: float
    available_memory_bytes: int
    budget_bytes: float  # this rank's memory ceiling
    reasons: tuple[str, ...]


def host_limits(cores: int, max_workers: int | None, local_ranks: int | None, memory_fraction: float,
                available_memory_bytes: int | None) -> HostLimits:
    """The search's limits for ``cores`` usable cores (``gpufeed.tune.usable_cores``); local
    ranks default to what a loader would find (``find_local_ranks``)."""
    if local_ranks is None:
        found = find_local_ranks()
        local_ranks = 1 if found is None else found.count
    else:
        check_int("local_ranks", local_ranks, 1)
    per_rank = fitting_workers(cores, local_ranks)
    reasons: list[str] = []
    if local_ranks > 1:
        fits = (f"at most {per_rank} worker{'s' if per_rank > 1 else ''} per rank ({local_ranks} x "
                f"(workers + 1 main process) <= {cores})" if local_ranks * (per_rank + 1) <= cores else
                f"1 worker per rank, the least ({local_ranks} x (1 + 1 main process) > {cores})")
        reasons.append(f"{local_ranks} local ranks share this host's {cores} usable cores: {fits}, "
                       f"and 1/{local_ranks} of the memory ceiling each.")
    if max_workers is None:
        max_workers = per_rank
    else:
        check_int("max_workers", max_workers, 1)
    if max_workers > per_rank:
        reasons.append(f"max_workers={max_workers} is above the {cores_text(cores)} (explicit)."
                       if local_ranks == 1 else
                       f"max_workers={max_workers} is above the {workers_text(per_rank)} per rank "
                       f"that fit (explicit).")
    if available_memory_bytes is None:
        available_memory_bytes = int(psutil.virtual_memory().available)
    return HostLimits(cores, local_ranks, max_workers, memory_fraction, available_memory_bytes,
                      memory_fraction * available_memory_bytes / local_ranks, tuple(reasons))


def workers_text(n: int) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{n} worker" if n == 1 else f"{n} workers"


def cores_text(n: int) -> str:
    """``1 usable core``, ``2 usable cores``."""
    return f"{n} usable core" if n == 1 else f"{n} usable cores"


class Search:
    """The state of one :func:`tune` search: its rows and reasons, in order."""

    def __init__(self, run: MeasureFn, min_gain: float, host: HostLimits, bar: ProgressBar) -> None:
        self.run, self.min_gain, self.host, self.bar = run, min_gain, host, bar
        self.rows: list[TuneRow] = []
        self.reasons: list[str] = []
        self.knee: int | None = None
        self.best: TuneRow | None = None

    def _measure(self, label: str, n: int, pin: bool) -> TuneRow:
        self.bar.start(label)
        row = self.run(n, pin)
        self.bar.done()
        self.rows.append(row)
        return row

    def _over_memory(self, n: int) -> bool:
        per_worker = max(r.memory_per_worker_bytes for r in self.rows)
        base = self.rows[0].base_memory_bytes
        projected = base + n * per_worker
        if projected <= self.host.budget_bytes:
            return False
        share = "" if self.host.local_ranks == 1 else f", per rank 1/{self.host.local_ranks} of it"
        self.reasons.append(
            f"stopped before {n} workers: projected memory {format_bytes(projected)} "
            f"({format_bytes(base)} + {n} x {format_bytes(per_worker)} per worker) "
            f"exceeds {self.host.memory_fraction:.0%} of the "
            f"{format_bytes(self.host.available_memory_bytes)} available{share}.")
        return True

    def counts(self, counts: list[int], dataset: Callable[[], Any], reads_at: tuple[int, ...] | None
               ) -> tuple[Any, tuple[int | None, int]] | None:
        """Measure the worker counts (steps 1-3); returns the dataset's read options to restore
        when the read search may change them. ``dataset()``: the dataset, once the first
        loader was made."""
        restore = None
        for n in counts:
            if self.best is not None and self._over_memory(n):
                break
            row = self._measure(workers_text(n), n, False)
            if self.best is None:
                self.reasons.append(f"{n} worker: {row.samples_per_s:.0f} images/s (baseline).")
                self.best = row
                target = dataset()
                options = read_options(target)
                if options is not None and reads_at:
                    restore = (target, options)
                    self.best, more, said = tune_reads(target, lambda _: self.run(counts[0], False), row,
                                                       self.min_gain, self.bar, reads_at)
                    self.rows += more
                    self.reasons += said
                continue
            gain = relative_gain(self.best.samples_per_s, row.samples_per_s)
            if gain < self.min_gain:
                self.knee = n
                best = workers_text(self.best.num_workers)
                self.reasons.append(
                    f"{n} workers: {row.samples_per_s:.0f} images/s, {gain:+.1%} over {best}, less "
                    f"than the {self.min_gain:.0%} a step must gain: throughput stopped rising after "
                    f"{best}; recommending {self.best.num_workers}, the last count before it stopped.")
                break
            self.reasons.append(f"{n} workers: {row.samples_per_s:.0f} images/s, {gain:+.1%} over "
                                f"{workers_text(self.best.num_workers)}, at least the "
                                f"{self.min_gain:.0%} a step must gain: more workers still help.")
            self.best = row
        else:
            host = self.host
            limit = (cores_text(host.cores) if host.local_ranks == 1 else
                     f"per rank: {cores_text(host.cores)} for {host.local_ranks} local ranks")
            self.reasons.append(f"stopped at {workers_text(host.max_workers)}: the max_workers limit "
                                f"({limit}).")
        return restore

    def pinned(self) -> tuple[TuneRow, bool]:
        """Step 4: the recommended row and whether pinning is recommended."""
        best = self.best
        assert best is not None  # the first count is always measured
        if not hasattr(os, "sched_setaffinity"):
            self.reasons.append("pin_workers not tried: os.sched_setaffinity is not available here.")
            return best, False
        pinned = self._measure(f"{workers_text(best.num_workers)} pinned", best.num_workers, True)
        gain = relative_gain(best.samples_per_s, pinned.samples_per_s)
        pin = gain >= self.min_gain
        self.reasons.append(f"pin_workers {'recommended' if pin else 'not recommended'}: one CPU "
                            f"per worker gave {pinned.samples_per_s:.0f} images/s against "
                            f"{best.samples_per_s:.0f} unpinned ({gain:+.1%}; it must gain "
                            f"{self.min_gain:+.0%}).")
        return (pinned if pin else best), pin
