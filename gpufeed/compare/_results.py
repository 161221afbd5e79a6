"""What ``compare`` returns: each counted round (:class:`RoundResult`), each loader's summary
over its rounds (:class:`LoaderSummary`: medians, peak memory, CPU per image), and the run
(:class:`CompareResult`: ratios against a baseline, the table, JSON)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufeed._observe.memory import format_bytes

__all__ = ["CompareResult", "LoaderSummary", "RoundResult"]


@dataclass(frozen=True)
class RoundResult:
    """One counted round of one loader. Times in seconds, memory in bytes."""

    loader: str
    round_index: int
    num_batches: int
    num_samples: int
    startup_s: float  # factory() + iter() + first batch
    steady_s: float  # from the first batch to the last (the first batch excluded)
    total_s: float  # startup_s + steady_s
    peak_pss_bytes: int
    mean_pss_bytes: float
    peak_footprint_bytes: int  # PSS with shared memory counted whole, mapped or not
    teardown_s: float  # dropping the loader until its worker processes are gone
    # the steady window (first batch to last): the samples after the first batch, and the CPU
    # seconds of the whole process tree (workers and this process) and of this process alone
    steady_samples: int = 0
    cpu_s: float = 0.0
    parent_cpu_s: float = 0.0
    # batches per second fitted to every batch's arrival time (0.0: not recorded, or < 2 batches)
    fitted_batches_per_s: float = 0.0

    @property
    def cpu_ms_per_sample(self) -> float:
        """CPU milliseconds of the process tree (parent and workers) per sample made in the
        steady window (its seconds times :attr:`samples_per_s`; nan without one): what a loader
        costs, which load beside it changes less than its rate."""
        made = self._steady_made()
        return 1e3 * self.cpu_s / made if made else float("nan")

    @property
    def parent_cpu_ms_per_sample(self) -> float:
        """This process's share of :attr:`cpu_ms_per_sample` (the consumer's work and the
        harness's memory sampler included)."""
        made = self._steady_made()
        return 1e3 * self.parent_cpu_s / made if made else float("nan")

    def _steady_made(self) -> float:
        if not self.fitted_batches_per_s:
            return float(self.steady_samples)
        return self.samples_per_s * self.steady_s

    @property
    def batches_per_s(self) -> float:
        """Steady-state batches per second: the slope of a least-squares line through the
        batches' arrival times (batch k at time t_k), so start-up (before the first batch) is
        left out and workers that deliver in step are not over-counted; without recorded
        arrivals, (batches - 1) / (last - first arrival). 0.0 with < 2 batches.

        Why a fit: with w workers delivering together every P seconds, the window from the first
        batch to the last holds the w - 1 batches that arrived with the first, made before it
        opened: (n - 1) / span over-counts by up to (w - 1) / (n - w), 10% for 2 workers and 12
        batches. The fit's slope is w / P whether the workers run in step or alternate."""
        if self.fitted_batches_per_s:
            return self.fitted_batches_per_s
        return (self.num_batches - 1) / self.steady_s if self.num_batches > 1 and self.steady_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Steady-state samples (images) per second, assuming equal batches."""
        if self.num_batches < 2:
            return 0.0
        return self.batches_per_s * self.num_samples / self.num_batches

    @property
    def total_batches_per_s(self) -> float:
        """Batches per second including start-up (loader construction, workers, first batch)."""
        return self.num_batches / self.total_s if self.total_s > 0 else 0.0


@dataclass(frozen=True)
class LoaderSummary:
    """One loader over all its counted rounds: medians of throughput, maxima of memory."""

    name: str
    rounds: tuple[RoundResult, ...]

    @property
    def median_batches_per_s(self) -> float:
        """Median steady-state batches per second over the rounds."""
        return statistics.median(r.batches_per_s for r in self.rounds)

    @property
    def median_samples_per_s(self) -> float:
        """Median steady-state samples (images) per second over the rounds."""
        return statistics.median(r.samples_per_s for r in self.rounds)

    @property
    def median_total_batches_per_s(self) -> float:
        """Median batches per second including start-up."""
        return statistics.median(r.total_batches_per_s for r in self.rounds)

    @property
    def median_startup_s(self) -> float:
        """Median seconds from the factory call to the first batch."""
        return statistics.median(r.startup_s for r in self.rounds)

    @property
    def median_cpu_ms_per_sample(self) -> float:
        """Median over the rounds of the tree's CPU milliseconds per steady-state sample."""
        return statistics.median(r.cpu_ms_per_sample for r in self.rounds)

    @property
    def min_batches_per_s(self) -> float:
        """Slowest round's batches per second."""
        return min(r.batches_per_s for r in self.rounds)

    @property
    def max_batches_per_s(self) -> float:
        """Fastest round's batches per second."""
        return max(r.batches_per_s for r in self.rounds)

    @property
    def peak_pss_bytes(self) -> int:
        """Highest PSS (bytes) of the process tree seen in any round."""
        return max(r.peak_pss_bytes for r in self.rounds)

    @property
    def peak_footprint_bytes(self) -> int:
        """Highest footprint (bytes: PSS with all shared memory counted, see PeakPSS) in any round."""
        return max(r.peak_footprint_bytes for r in self.rounds)

    @property
    def mean_pss_bytes(self) -> float:
        """Mean over rounds of each round's mean PSS (bytes)."""
        return statistics.fmean(r.mean_pss_bytes for r in self.rounds)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the summary figures and every round."""
        return {
            "name": self.name,
            "median_batches_per_s": self.median_batches_per_s,
            "median_samples_per_s": self.median_samples_per_s,
            "median_total_batches_per_s": self.median_total_batches_per_s,
            "median_startup_s": self.median_startup_s,
            "median_cpu_ms_per_sample": self.median_cpu_ms_per_sample,
            "min_batches_per_s": self.min_batches_per_s,
            "max_batches_per_s": self.max_batches_per_s,
            "peak_pss_bytes": self.peak_pss_bytes,
            "peak_footprint_bytes": self.peak_footprint_bytes,
            "mean_pss_bytes": self.mean_pss_bytes,
            "rounds": [
                {
                    **asdict(r),
                    "batches_per_s": r.batches_per_s,
                    "samples_per_s": r.samples_per_s,
                    "total_batches_per_s": r.total_batches_per_s,
                    "cpu_ms_per_sample": r.cpu_ms_per_sample,
                    "parent_cpu_ms_per_sample": r.parent_cpu_ms_per_sample,
                }
                for r in self.rounds
            ],
        }


@dataclass(frozen=True)
class CompareResult:
    """The outcome of :func:`compare`. Ratios are ``loader / baseline`` (> 1: faster or bigger)."""

    loaders: tuple[LoaderSummary, ...]
    baseline: str
    num_rounds: int
    num_warmup_rounds: int
    num_batches: int | None  # None: one epoch per round
    environment: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    rotated: bool = False  # True: each round started one loader further on (``compare(rotate=)``)

    def summary(self, name: str) -> LoaderSummary:
        """The summary of the loader called ``name``."""
        for s in self.loaders:
            if s.name == name:
                return s
        raise KeyError(f"no loader named {name!r}; have {[s.name for s in self.loaders]}")

    def ratio(self, name: str, baseline: str | None = None) -> float:
        """Median steady batches/s of ``name`` divided by the baseline's (> 1: ``name`` is faster)."""
        base = self.summary(baseline or self.baseline).median_batches_per_s
        return self.summary(name).median_batches_per_s / base if base > 0 else float("nan")

    def paired_ratios(self, name: str, baseline: str | None = None) -> list[float]:
        """Per-round ratios ``name / baseline`` (their runs in the same round), in round order."""
        a = self.summary(name).rounds
        b = self.summary(baseline or self.baseline).rounds
        return [x.batches_per_s / y.batches_per_s if y.batches_per_s > 0 else float("nan") for x, y in zip(a, b)]

    def memory_ratio(self, name: str, baseline: str | None = None) -> float:
        """Peak PSS of ``name`` divided by the baseline's (< 1: ``name`` uses less)."""
        base = self.summary(baseline or self.baseline).peak_pss_bytes
        return self.summary(name).peak_pss_bytes / base if base > 0 else float("nan")

    def footprint_ratio(self, name: str, baseline: str | None = None) -> float:
        """Peak footprint of ``name`` divided by the baseline's (< 1: ``name`` uses less)."""
        base = self.summary(baseline or self.baseline).peak_footprint_bytes
        return self.summary(name).peak_footprint_bytes / base if base > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data (bytes, seconds, per second)."""
        return {
            "baseline": self.baseline,
            "num_rounds": self.num_rounds,
            "num_warmup_rounds": self.num_warmup_rounds,
            "num_batches": self.num_batches,
            "rotated": self.rotated,
            "loaders": [s.to_dict() for s in self.loaders],
            "ratios": {
                s.name: {
                    "batches_per_s": self.ratio(s.name),
                    "paired_batches_per_s": self.paired_ratios(s.name),
                    "peak_pss": self.memory_ratio(s.name),
                    "peak_footprint": self.footprint_ratio(s.name),
                }
                for s in self.loaders
            },
            "environment": dict(self.environment),
            "notes": list(self.notes),
        }

    def format_table(self) -> str:
        """A fixed-width table for people: medians, spread, start-up, memory and ratios."""
        w = max(len("loader"), *(len(s.name) for s in self.loaders))
        header = (
            f"{'loader':<{w}} {'batches/s':>10} {'min..max':>13} {'images/s':>9} {'startup':>8} "
            f"{'peak PSS':>10} {'footprint':>10} {'speed x':>8} {'PSS x':>6} {'fp x':>5} {'cpu/img':>8}"
        )
        lines = [header, "-" * len(header)]
        for s in self.loaders:
            spread = f"{s.min_batches_per_s:.1f}..{s.max_batches_per_s:.1f}"
            lines.append(
                f"{s.name:<{w}} {s.median_batches_per_s:>10.1f} {spread:>13} "
                f"{s.median_samples_per_s:>9.0f} {s.median_startup_s:>7.2f}s "
                f"{format_bytes(s.peak_pss_bytes):>10} {format_bytes(s.peak_footprint_bytes):>10} "
                f"{self.ratio(s.name):>8.2f} {self.memory_ratio(s.name):>6.2f} {self.footprint_ratio(s.name):>5.2f} "
                f"{s.median_cpu_ms_per_sample:>6.2f}ms"
            )
        per = "one epoch" if self.num_batches is None else f"{self.num_batches} batches"
        lines.append(
            f"({self.num_rounds} rounds of {per} per loader, alternating, after "
            f"{self.num_warmup_rounds} warm-up round(s); medians; ratios vs {self.baseline}; "
            "batches/s fitted to the batches' arrival times, startup is time to the first; peak PSS summed over the "
            "process tree; footprint = that PSS with shared memory counted whole, mapped or not; "
            "cpu/img: CPU of the process tree per image made after the first batch)"
        )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)
