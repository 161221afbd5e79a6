"""Prometheus metrics of gpufeed loaders: one HTTP endpoint per (addr, port) in the process (the
code; documented in ``gpufeed.metrics``, which re-exports it)."""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from gpufeed.cache._job import host_metrics_exporter
from gpufeed.errors import BackendUnavailableError, check_int, shorten
from gpufeed.stats import STAGES

__all__ = ["HOST_METRIC_NAMES", "METRIC_NAMES", "MetricsServer", "start_server"]

log = logging.getLogger("gpufeed.metrics")  # the public module's name, which users configure

THREAD_NAME = "gpufeed-metrics"
STOP_TIMEOUT_S = 5.0

# stats() key -> (metric name without the exposition's "_total" suffix, HELP text with units).
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("batches", "gpufeed_batches", "Batches delivered to the consumer (count)."),
    ("samples", "gpufeed_samples", "Samples delivered to the consumer (count)."),
    (
        "wait_s",
        "gpufeed_data_wait_seconds",
        "Wall seconds the consumer spent blocked in __next__ waiting for data (seconds).",
    ),
    ("errors", "gpufeed_errors", "Exceptions raised by dataset/collate code in workers (count)."),
    ("skipped", "gpufeed_skipped", "Undecodable samples left out with on_error='skip' (count)."),
    ("worker_restarts", "gpufeed_worker_restarts", "Dead worker processes replaced (count)."),
    ("cache_hits", "gpufeed_cache_hits",
     "Host cache lookups that found the sample (decoded row or encoded bytes) (count)."),
    ("cache_misses", "gpufeed_cache_misses", "Host cache lookups that had to read storage (count)."),
)
_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "data_wait_fraction",
        "gpufeed_data_wait_fraction",
        "Share of wall time since the first batch request spent waiting for data (ratio 0-1).",
    ),
    ("queue_depth", "gpufeed_queue_depth", "Ready batches at the last __next__ (batches)."),
    (
        "queue_depth_mean",
        "gpufeed_queue_depth_mean",
        "Mean ready batches at __next__ since creation (batches).",
    ),
    ("cache_bytes", "gpufeed_cache_bytes", "Bytes held by the loader's host cache (bytes)."),
    ("pinned_bytes", "gpufeed_pinned_bytes",
     "Arena bytes page-locked for the CUDA feed now, 0 without device= (bytes)."),
    ("cache_hit_rate", "gpufeed_cache_hit_ratio", "Host cache hits / lookups since creation (ratio 0-1)."),
    (
        "samples_per_s",
        "gpufeed_samples_per_second",
        "Samples delivered per wall second since the first batch request (samples/s).",
    ),
)
_STAGE_NAME = "gpufeed_stage_seconds"
_STAGE_HELP = "Worker seconds spent per pipeline stage, summed over workers (seconds)."
# stats() key -> the ``stage`` label: "fetch_s" -> "fetch"
_STAGE_LABELS: dict[str, str] = {key: key.removesuffix("_s") for key in STAGES}
_WORKER_CPU = (
    "gpufeed_worker_cpu_seconds",
    "CPU seconds (user + system) of each live worker process (seconds).",
)
_WORKER_RSS = ("gpufeed_worker_rss_bytes", "Resident memory of each live worker process (bytes).")
_WORKERS = ("gpufeed_workers", "Live worker processes (count).")
# The host cache shared by a job's ranks (``cache_shared``): its bytes and budget are the host's,
# so only local rank 0 (LOCAL_RANK unset counts as 0) exports them, once, without a loader label,
# and a shared loader exports no per-loader gpufeed_cache_bytes: a sum over ranks is the host's.
_HOST_CACHE = (
    ("cache_bytes", "gpufeed_host_cache_bytes",
     "Bytes held by the host cache shared by the job's ranks, exported by local rank 0 only (bytes)."),
    ("cache_budget_bytes", "gpufeed_host_cache_budget_bytes",
     "Budget of the host cache shared by the job's ranks, exported by local rank 0 only (bytes)."),
)

METRIC_NAMES: frozenset[str] = frozenset(
    [name + "_total" for _, name, _ in _COUNTERS]
    + [name for _, name, _ in _GAUGES]
    + [_STAGE_NAME + "_total", _WORKER_CPU[0] + "_total", _WORKER_RSS[0], _WORKERS[0]]
)
"""Every per-loader metric name the collector can emit, as Prometheus exposes it (counters end
in ``_total``)."""
HOST_METRIC_NAMES: frozenset[str] = frozenset(name for _, name, _ in _HOST_CACHE)
"""The host cache's metrics (no ``loader`` label), emitted by local rank 0 only."""

_servers: dict[tuple[str, int], MetricsServer] = {}
_servers_lock = threading.Lock()


def start_server(port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve gpufeed's metrics over HTTP at ``http://ADDR:PORT/metrics`` and return the server.

    Once per (addr, port) in this process: a second call with the same arguments (or with the
    port that ``port=0`` picked) returns the running server. ``port=0`` picks a free port; read
    it from ``.port``. The serving thread is a daemon named ``gpufeed-metrics``.

    Raises:
        ValueError: ``port`` is not an int in 0-65535.
        BackendUnavailableError: prometheus-client (the ``metrics`` extra) is not installed.
        OSError: the port cannot be bound (already in use by another program).
    """
    check_int("port", port, 0, 65535, rule="in 0-65535 (0: any free port)")
    if not isinstance(addr, str) or not addr:
        raise ValueError(f"`addr` must be a non-empty host address string. Found: {shorten(addr)}.")
    with _servers_lock:
        server = _servers.get((addr, port))
        if server is not None and not server.stopped:
            return server
        server = MetricsServer._start(port, addr)
        _servers[(addr, port)] = server
        _servers[(addr, server.port)] = server
        return server


def _import_prometheus() -> Any:
    try:
        import prometheus_client
        from prometheus_client import exposition, registry
    except ImportError as exc:
        raise BackendUnavailableError(
            "gpufeed's Prometheus metrics need prometheus-client, which is not installed. "
            "Fix: pip install 'gpufeed[metrics]' (or pip install prometheus-client); "
            "or leave `metrics_port` unset."
        ) from exc
    return prometheus_client, exposition, registry


class MetricsServer:
    """A running metrics endpoint and the loaders it reports. Create it with :func:`start_server`.

    Attributes:
        addr: the bound address.
        port: the bound TCP port (the one picked when ``start_server(0)`` was called).
    """

    def __init__(self, addr: str, port: int, httpd: Any, thread: threading.Thread) -> None:
        self.addr = addr
        self.port = port
        self._httpd = httpd
        self._thread = thread
        self._lock = threading.Lock()
        self._loaders: dict[int, tuple[weakref.ref, str]] = {}
        self._names = (f"loader{i}" for i in itertools.count())
        self._stopped = False

    @classmethod
    def _start(cls, port: int, addr: str) -> MetricsServer:
        prometheus_client, _, registry_mod = _import_prometheus()
        registry = registry_mod.CollectorRegistry(auto_describe=False)
        started = prometheus_client.start_http_server(port, addr=addr, registry=registry)
        if not isinstance(started, tuple):  # prometheus-client < 0.20 returns None: no way to stop it
            raise BackendUnavailableError(
                "gpufeed's metrics need prometheus-client >= 0.20 (start_http_server returning its "
                "server). Fix: pip install -U 'gpufeed[metrics]'."
            )
        httpd, thread = started
        thread.name = THREAD_NAME
        server = cls(addr, httpd.server_address[1], httpd, thread)
        registry.register(_LoaderCollector(server._live_loaders))
        log.info("gpufeed metrics at http://%s:%d/metrics", addr, server.port)
        return server

    @property
    def url(self) -> str:
        """The scrape URL, ``http://ADDR:PORT/metrics``."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped

    def register(self, loader: Any, name: str | None = None) -> str:
        """Report ``loader`` (anything with a ``stats()`` dict) under ``loader="NAME"``; return NAME.

        The server keeps a weak reference: once the loader is garbage collected its series are
        gone from the next scrape. ``name`` defaults to ``loader0``, ``loader1``, ... in
        registration order. Registering a loader again renames it.

        Raises:
            TypeError: ``loader`` has no callable ``stats``, or ``name`` is not a string.
            ValueError: ``name`` is empty or already used by another live loader.
        """
        if not callable(getattr(loader, "stats", None)):
            found = type(loader).__name__
            raise TypeError(f"`loader` must have a stats() method (a FastLoader). Found: {found}.")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"`name` must be a non-empty string or None. Found: {shorten(name)}.")
        key = id(loader)
        with self._lock:
            taken = {n for k, (ref, n) in self._loaders.items() if k != key and ref() is not None}
            if name is None:
                name = next(n for n in self._names if n not in taken)
            elif name in taken:
                raise ValueError(
                    f"`name` {name!r} is already used by another registered loader; pick another."
                )
            self._loaders[key] = (weakref.ref(loader, self._forget(key)), name)
        return name

    def unregister(self, loader: Any) -> None:
        """Stop reporting ``loader`` (no-op when it is not registered)."""
        with self._lock:
            entry = self._loaders.get(id(loader))
            if entry is not None and entry[0]() is loader:
                del self._loaders[id(loader)]

    def names(self) -> list[str]:
        """Names of the live registered loaders, in registration order."""
        return [name for _, name in self._live_loaders()]

    def _forget(self, key: int) -> Callable[[weakref.ref], None]:
        self_ref = weakref.ref(self)

        def forget(dead: weakref.ref) -> None:
            server = self_ref()
            if server is None:
                return
            with server._lock:
                entry = server._loaders.get(key)
                if entry is not None and entry[0] is dead:
                    del server._loaders[key]

        return forget

    def _live_loaders(self) -> list[tuple[Any, str]]:
        with self._lock:
            entries = list(self._loaders.values())
        return [(loader, name) for ref, name in entries if (loader := ref()) is not None]

    def stop(self) -> None:
        """Shut the HTTP server down, join its thread, free the port (idempotent).

        A later :func:`start_server` on the same port starts a new server.
        """
        with _servers_lock:
            if self._stopped:
                return
            self._stopped = True
            for key in [k for k, s in _servers.items() if s is self]:
                del _servers[key]
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("gpufeed metrics thread did not exit within %.1f s", STOP_TIMEOUT_S)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "serving"
        return f"MetricsServer({self.url}, {state}, loaders={self.names()})"


class _LoaderCollector:
    """A prometheus_client collector: every scrape reads ``stats()`` of each live loader."""

    def __init__(self, live_loaders: Callable[[], list[tuple[Any, str]]]) -> None:
        self._live_loaders = live_loaders

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshots = []
        for loader, name in self._live_loaders():
            try:
                snapshots.append((name, loader.stats()))
            except Exception:  # one broken loader must not take the whole endpoint down
                log.warning(
                    "gpufeed metrics: stats() of loader %r failed; left out of this scrape",
                    name,
                    exc_info=True,
                )

        for key, metric, help_text in _COUNTERS:
            yield from _family(CounterMetricFamily, metric, help_text, key, snapshots)
        stages = CounterMetricFamily(_STAGE_NAME, _STAGE_HELP, labels=["loader", "stage"])
        for name, stats in snapshots:
            for key, stage in _STAGE_LABELS.items():
                if key in stats:
                    stages.add_metric([name, stage], float(stats[key]))
        if stages.samples:
            yield stages
        cpu = CounterMetricFamily(*_WORKER_CPU, labels=["loader", "worker"])
        rss = GaugeMetricFamily(*_WORKER_RSS, labels=["loader", "worker"])
        workers = GaugeMetricFamily(*_WORKERS, labels=["loader"])
        for name, stats in snapshots:
            rows = stats.get("workers")
            if rows is None:
                continue
            workers.add_metric([name], float(len(rows)))
            for row in rows:
                worker = str(row["worker"])
                cpu.add_metric([name, worker], float(row["cpu_s"]))
                rss.add_metric([name, worker], float(row["rss_bytes"]))
        for family in (cpu, rss, workers):
            if family.samples:
                yield family
        shared = [stats for _, stats in snapshots if stats.get("cache_shared")]
        for key, metric, help_text in _GAUGES:
            own = [(n, s) for n, s in snapshots if key != "cache_bytes" or not s.get("cache_shared")]
            yield from _family(GaugeMetricFamily, metric, help_text, key, own)
        if shared and host_metrics_exporter():
            for key, metric, help_text in _HOST_CACHE:
                family = GaugeMetricFamily(metric, help_text)
                family.add_metric([], float(shared[0][key]))
                yield family


def _family(
    cls: type, metric: str, help_text: str, key: str, snapshots: list[tuple[str, dict]]
) -> Iterator[Any]:
    """One family with a sample per loader whose stats() has ``key``; nothing if none has it."""
    family = cls(metric, help_text, labels=["loader"])
    for name, stats in snapshots:
        if key in stats:
            family.add_metric([name], float(stats[key]))
    if family.samples:
        yield family
