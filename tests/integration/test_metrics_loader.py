"""Prometheus metrics of real loaders with a worker process equal their stats; the metrics port end to end."""

from __future__ import annotations

import pytest

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.metrics import MetricsServer
from tests.unit.test_metrics import (
    COUNTERS,
    IMAGE_ONLY,
    STAGES,
    metrics_threads,
    names_of,
    scrape,
    series_of,
    server,  # noqa: F401 (fixtures, used by name)
    tensor_loader,
)


@pytest.mark.timeout(60)
def test_scrape_of_a_real_loader_equals_its_stats(server):
    loader = tensor_loader(num_workers=1, persistent_workers=True)
    try:
        assert sum(len(y) for _, y in loader) == 20
        assert server.register(loader, name="train") == "train"
        got = series_of(scrape(server), "train")
        stats = loader.stats()
        one = frozenset({("loader", "train")})
        for metric, key in COUNTERS.items():
            assert got[(metric, one)] == pytest.approx(stats[key]), metric
        assert got[("gpufeed_batches_total", one)] == 5 and got[("gpufeed_samples_total", one)] == 20
        for stage in STAGES:
            labels = frozenset({("loader", "train"), ("stage", stage)})
            assert got[("gpufeed_stage_seconds_total", labels)] == pytest.approx(stats[f"{stage}_s"])
        fetch = frozenset({("loader", "train"), ("stage", "fetch")})
        assert got[("gpufeed_stage_seconds_total", fetch)] > 0
        assert got[("gpufeed_queue_depth", one)] == stats["queue_depth"]
        assert got[("gpufeed_queue_depth_mean", one)] == pytest.approx(stats["queue_depth_mean"])
        assert 0 < got[("gpufeed_data_wait_fraction", one)] <= 1  # lifetime ratio: decays while idle
        assert got[("gpufeed_samples_per_second", one)] > 0
        # the persistent worker: one per-worker series each, labelled by worker id
        assert got[("gpufeed_workers", one)] == 1 == len(stats["workers"])
        w0 = frozenset({("loader", "train"), ("worker", "0")})
        assert got[("gpufeed_worker_rss_bytes", w0)] > 1 << 20
        assert got[("gpufeed_worker_cpu_seconds_total", w0)] >= 0
        # a generic (non-image) loader has no cache or skip keys, so those are not emitted
        assert not IMAGE_ONLY & stats.keys()
        assert not {n for n in names_of(got, "train") if "cache" in n or "skipped" in n}
    finally:
        loader.close()


@pytest.mark.timeout(60)
def test_image_loader_cache_and_skip_metrics_equal_its_stats(server, image_folder):
    root = image_folder(num_classes=2, per_class=3, size=(40, 48), seed=3)
    ds = ImageFolder(root, transform=ResizeCenterCrop(32, 32))
    loader = FastLoader(ds, batch_size=3, num_workers=1, cache_bytes="16MB")
    try:
        for _ in range(2):
            assert sum(len(y) for _, y in loader) == 6
        server.register(loader, name="img")
        got = series_of(scrape(server), "img")
        stats = loader.stats()
        one = frozenset({("loader", "img")})
        assert (stats["cache_hits"], stats["cache_misses"]) == (6, 6)
        assert got[("gpufeed_cache_hits_total", one)] == 6
        assert got[("gpufeed_cache_misses_total", one)] == 6
        assert got[("gpufeed_cache_bytes", one)] == stats["cache_bytes"] > 0
        assert got[("gpufeed_cache_hit_ratio", one)] == pytest.approx(0.5)
        assert got[("gpufeed_skipped_total", one)] == stats["skipped"] == 0
        assert got[("gpufeed_samples_total", one)] == 12
        decode = frozenset({("loader", "img"), ("stage", "decode")})
        assert got[("gpufeed_stage_seconds_total", decode)] > 0
    finally:
        loader.close()


@pytest.mark.timeout(60)
def test_fastloader_metrics_port_serves_it_end_to_end():
    loader = tensor_loader(num_workers=1, metrics_port=0)
    srv = loader.metrics_server
    try:
        assert isinstance(srv, MetricsServer) and srv.port > 0
        assert srv.names() == ["loader0"]
        assert scrape(srv)[("gpufeed_batches_total", frozenset({("loader", "loader0")}))] == 0
        list(loader)
        got = scrape(srv)
        assert got[("gpufeed_batches_total", frozenset({("loader", "loader0")}))] == 5
        assert got[("gpufeed_samples_total", frozenset({("loader", "loader0")}))] == 20
        second = tensor_loader(metrics_port=srv.port)  # same port: same server, next name
        assert second.metrics_server is srv and srv.names() == ["loader0", "loader1"]
    finally:
        loader.close()
        srv.stop()
    assert not metrics_threads()
