"""Counters and histograms of a batcher, its ``stats()`` dict, and its Prometheus collector.

Quantiles (p50/p99) are computed from the histograms as Prometheus' ``histogram_quantile``
does: linear interpolation inside the bucket that holds the rank. The collector emits
``gpufeed_serve_*`` families labelled ``batcher``; register it in any
``prometheus_client`` registry::

    prometheus_client.REGISTRY.register(BatcherCollector(batcher))

Importing this module does not import prometheus_client.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from gpufeed._observe.batches import doublings
from gpufeed.errors import BackendUnavailableError

__all__ = ["LATENCY_BUCKETS_S", "METRIC_NAMES", "BatcherCollector", "Histogram"]

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
"""Upper bounds of the queue-wait and latency histograms (seconds); an implicit +Inf follows."""


class Histogram:
    """Counts of observations per bucket (upper bounds inclusive, +Inf last), their sum and count.

    Not thread-safe by itself: the batcher's stats lock guards it.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"`bounds` must be strictly increasing. Found: {bounds}.")
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0-1) by linear interpolation in its bucket; NaN when empty.

        A rank in the +Inf bucket gives the highest finite bound, as Prometheus does.
        """
        if self.count == 0:
            return math.nan
        rank = q * self.count
        cumulative = 0
        for i, n in enumerate(self.counts):
            if n and cumulative + n >= rank:
                if i == len(self.bounds):
                    return self.bounds[-1]
                lower = 0.0 if i == 0 else self.bounds[i - 1]
                return lower + (self.bounds[i] - lower) * (rank - cumulative) / n
            cumulative += n
        return self.bounds[-1]

    def snapshot(self) -> dict[str, Any]:
        """``{"bounds", "counts", "sum", "count"}``: per-bucket (not cumulative) counts, +Inf last."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum, "count": self.count}


def batch_size_bounds(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``max_batch_size``, then ``max_batch_size`` itself."""
    return tuple(doublings(max_batch_size))


class BatcherStats:
    """The batcher's counters (one lock). Keys of ``snapshot()`` are documented on
    :meth:`gpufeed.serve.DynamicBatcher.stats`."""

    COUNTERS = ("requests", "rejected", "rejected_latency", "expired", "cancelled", "invalid", "completed",
                "failed", "batches")

    def __init__(self, max_batch_size: int) -> None:
        self.lock = threading.Lock()
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.batch_size = Histogram(batch_size_bounds(max_batch_size))
        self.queue_wait_s = Histogram(LATENCY_BUCKETS_S)
        self.latency_s = Histogram(LATENCY_BUCKETS_S)

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counters[key] += n

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = dict(self.counters)
            out["batch_size_mean"] = self.batch_size.sum / self.batch_size.count if self.batch_size.count else 0.0
            out["queue_wait_p50_s"] = self.queue_wait_s.quantile(0.5)
            out["queue_wait_p99_s"] = self.queue_wait_s.quantile(0.99)
            out["latency_p50_s"] = self.latency_s.quantile(0.5)
            out["latency_p99_s"] = self.latency_s.quantile(0.99)
            out["batch_size_hist"] = self.batch_size.snapshot()
            out["queue_wait_s_hist"] = self.queue_wait_s.snapshot()
            out["latency_s_hist"] = self.latency_s.snapshot()
        return out


# stats() counter key -> (metric name without "_total", HELP text with units)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("requests", "gpufeed_serve_requests", "Requests accepted by submit() (count)."),
    ("rejected", "gpufeed_serve_rejected",
     "Requests rejected with Overloaded: queue full or over max_latency_ms (count)."),
    ("rejected_latency", "gpufeed_serve_rejected_latency",
     "Of those, rejected because their predicted latency exceeded max_latency_ms (count)."),
    ("expired", "gpufeed_serve_expired", "Requests failed with TimeoutError before reaching the model (count)."),
    ("cancelled", "gpufeed_serve_cancelled", "Requests cancelled before their batch ran (count)."),
    ("invalid", "gpufeed_serve_invalid", "Requests failed by the validate hook (count)."),
    ("completed", "gpufeed_serve_completed", "Requests answered with a result (count)."),
    ("failed", "gpufeed_serve_failed", "Requests failed by the model function or collate (count)."),
    ("batches", "gpufeed_serve_batches", "Calls of the model function (count)."),
)
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("queue_depth", "gpufeed_serve_queue_depth", "Requests waiting in the queue (requests)."),
    ("running_batches", "gpufeed_serve_running_batches", "Batches in the model function now (batches)."),
)
_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("batch_size_hist", "gpufeed_serve_batch_size", "Requests per batch, padding excluded (requests)."),
    ("queue_wait_s_hist", "gpufeed_serve_queue_wait_seconds", "Arrival to dispatch of each request (seconds)."),
    ("latency_s_hist", "gpufeed_serve_latency_seconds", "Arrival to result of each request (seconds)."),
)

METRIC_NAMES: frozenset[str] = frozenset(
    [name + "_total" for _, name, _ in _COUNTERS] + [name for _, name, _ in _GAUGES + _HISTOGRAMS]
)
"""Every family the collector emits (counters as exposed, with ``_total``)."""


class BatcherCollector:
    """A prometheus_client collector of one or more batchers (weak references), label ``batcher``.

    Raises:
        BackendUnavailableError: prometheus-client (the ``metrics`` extra) is not installed.
    """

    def __init__(self, *batchers: Any) -> None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError(
                "gpufeed.serve's metrics need prometheus-client, which is not installed. "
                "Fix: pip install 'gpufeed[metrics]' (or pip install prometheus-client)."
            ) from exc
        self._batchers: list[weakref.ref] = []
        for batcher in batchers:
            self.add(batcher)

    def add(self, batcher: Any) -> None:
        """Report ``batcher`` too (under its ``name``)."""
        self._batchers.append(weakref.ref(batcher))

    def collect(self) -> Iterator[Any]:
        """One scrape: ``stats()`` of every live batcher."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snapshots = []
        for ref in list(self._batchers):
            batcher = ref()
            if batcher is None:
                continue
            try:
                snapshots.append((batcher.name, batcher.stats()))
            except Exception:  # one broken batcher must not take the endpoint down
                log.warning("gpufeed.serve metrics: stats() of %r failed", batcher, exc_info=True)
        if not snapshots:
            return
        for key, metric, help_text in _COUNTERS:
            counter = CounterMetricFamily(metric, help_text, labels=["batcher"])
            for name, stats in snapshots:
                counter.add_metric([name], float(stats[key]))
            yield counter
        for key, metric, help_text in _GAUGES:
            gauge = GaugeMetricFamily(metric, help_text, labels=["batcher"])
            for name, stats in snapshots:
                gauge.add_metric([name], float(stats[key]))
            yield gauge
        for key, metric, help_text in _HISTOGRAMS:
            hist = HistogramMetricFamily(metric, help_text, labels=["batcher"])
            for name, stats in snapshots:
                h = stats[key]
                cumulative, buckets = 0, []
                for bound, n in zip(h["bounds"] + [math.inf], h["counts"]):
                    cumulative += n
                    buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), float(cumulative)))
                hist.add_metric([name], buckets, sum_value=h["sum"])
            yield hist
