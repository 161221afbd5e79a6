"""Prometheus metrics of gpufeed loaders: one HTTP endpoint per (addr, port) in the process.

::

    server = gpufeed.metrics.start_server(9400)      # or FastLoader(..., metrics_port=9400)
    server.register(loader, name="train")     # weak reference; a dead loader disappears
    # curl http://127.0.0.1:9400/metrics  ->  gpufeed_batches_total{loader="train"} 1234.0 ...
    server.stop()

Each scrape calls ``loader.stats()`` of every live registered loader and turns it into
``gpufeed_*`` families labelled ``loader``; nothing is sampled in between, so an idle endpoint
costs nothing. The server uses its own ``CollectorRegistry``, never prometheus_client's global
``REGISTRY``: serving gpufeed's metrics adds nothing to (and exposes nothing of) the user's own.

Importing this module starts nothing and does not import prometheus_client; ``start_server`` does, and
raises ``BackendUnavailableError`` when the ``metrics`` extra is not installed.
"""

from gpufeed.metrics._metrics import (
    HOST_METRIC_NAMES,
    METRIC_NAMES,
    MetricsServer,
    start_server,
)

__all__ = [
    "HOST_METRIC_NAMES",
    "METRIC_NAMES",
    "MetricsServer",
    "start_server",
]
