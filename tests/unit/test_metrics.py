"""gpufeed.metrics: the scraped text equals loader.stats(), servers start once and stop cleanly,
dead loaders vanish, and the shipped alerts and dashboard use only metrics the collector emits.

Scrapes go over loopback HTTP with urllib and are parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import gc
import json
import re
import socket
import threading
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families
from torch.utils.data import TensorDataset

from gpufeed import FastLoader
from gpufeed.metrics import HOST_METRIC_NAMES, METRIC_NAMES, MetricsServer, start_server
from gpufeed.stats import STAGES as STAGE_KEYS

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
STAGES = tuple(key.removesuffix("_s") for key in STAGE_KEYS)  # the `stage` labels
COUNTERS = {  # metric -> stats() key
    "gpufeed_batches_total": "batches",
    "gpufeed_samples_total": "samples",
    "gpufeed_data_wait_seconds_total": "wait_s",
    "gpufeed_errors_total": "errors",
    "gpufeed_worker_restarts_total": "worker_restarts",
}
IMAGE_ONLY = {"skipped", "cache_hits", "cache_misses", "cache_bytes", "cache_hit_rate"}


# -- helpers ---------------------------------------------------------------------------------------


@pytest.fixture
def server():
    srv = start_server(0)
    yield srv
    srv.stop()


def tensor_loader(**kwargs) -> FastLoader:
    ds = TensorDataset(torch.arange(40.0).view(20, 2), torch.arange(20))
    return FastLoader(ds, batch_size=4, **kwargs)


def scrape(srv: MetricsServer) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one scrape of ``srv``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def series_of(samples: dict, loader: str) -> dict[tuple[str, frozenset], float]:
    return {k: v for k, v in samples.items() if ("loader", loader) in k[1]}


def names_of(samples: dict, loader: str) -> set[str]:
    return {name for name, _ in series_of(samples, loader)}


def metrics_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpufeed-metrics"]


class FakeLoader:
    """Anything with a stats() dict can be reported; this one has every key an image loader has."""

    def __init__(self, **overrides) -> None:
        self.values = {
            "batches": 7, "samples": 50, "wait_s": 1.5, "errors": 2, "worker_restarts": 1,
            "skipped": 3, "cache_hits": 30, "cache_misses": 20, "cache_bytes": 4096,
            "cache_hit_rate": 0.6, "data_wait_fraction": 0.25, "queue_depth": 2,
            "queue_depth_mean": 1.5, "samples_per_s": 123.0, "overflow_bytes": 0, "pinned_bytes": 6 << 20,
            "path": "generic", "path_reason": "a custom collate_fn is used",  # text: not exported
            **{f"{stage}_s": i + 0.5 for i, stage in enumerate(STAGES)},
            "workers": [
                {"worker": 0, "pid": 11, "cpu_s": 3.25, "rss_bytes": 1 << 20},
                {"worker": 1, "pid": 12, "cpu_s": 4.5, "rss_bytes": 2 << 20},
            ],
        }
        self.values.update(overrides)

    def stats(self) -> dict:
        return dict(self.values)


# -- scrape == stats() -----------------------------------------------------------------------------


def test_every_stats_key_maps_to_exactly_the_documented_metric_names(server):
    fake = FakeLoader()
    server.register(fake, name="fake")
    got = series_of(scrape(server), "fake")
    assert names_of(got, "fake") == METRIC_NAMES
    one = frozenset({("loader", "fake")})
    assert got[("gpufeed_skipped_total", one)] == 3
    assert got[("gpufeed_cache_hit_ratio", one)] == 0.6
    assert got[("gpufeed_pinned_bytes", one)] == 6 << 20
    w1 = frozenset({("loader", "fake"), ("worker", "1")})
    assert got[("gpufeed_worker_cpu_seconds_total", w1)] == 4.5
    assert got[("gpufeed_worker_rss_bytes", w1)] == 2 << 20
    assert got[("gpufeed_workers", one)] == 2
    assert got[("gpufeed_stage_seconds_total", frozenset({("loader", "fake"), ("stage", "h2d")}))] == 6.5
    labels = {dict(k)["stage"] for name, k in got if name == "gpufeed_stage_seconds_total"}
    assert labels == set(STAGES) and len(STAGES) == len(STAGE_KEYS) == 7


def test_a_shared_host_cache_is_exported_once_by_local_rank_zero(server, monkeypatch):
    shared = {"cache_shared": 1, "cache_bytes": 5000, "cache_budget_bytes": 9000}
    train, val = FakeLoader(**shared), FakeLoader(**shared)
    server.register(train, name="train")
    server.register(val, name="val")
    monkeypatch.setenv("LOCAL_RANK", "0")
    got = scrape(server)
    host = {name: value for (name, labels), value in got.items() if name in HOST_METRIC_NAMES}
    assert host == {"gpufeed_host_cache_bytes": 5000, "gpufeed_host_cache_budget_bytes": 9000}
    assert not [key for key in got if key[0] == "gpufeed_cache_bytes"]  # per loader: not emitted
    assert got[("gpufeed_cache_hits_total", frozenset({("loader", "val")}))] == 30  # per rank, kept
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not {name for name, _ in scrape(server)} & HOST_METRIC_NAMES


def test_stage_labels_documented_are_the_stats_stages():
    text = (MONITORING / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `gpufeed_stage_seconds_total"))
    documented = re.findall(r"`(\w+)`", row.split("summed over workers:")[1])
    assert tuple(documented) == STAGES


def test_help_texts_name_their_units(server):
    fake = FakeLoader()  # the server holds it weakly: keep it alive
    server.register(fake, name="fake")
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        text = resp.read().decode()
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    assert set(helps) == METRIC_NAMES
    for name, help_text in helps.items():
        assert re.search(r"\((count|seconds|bytes|batches|samples/s|ratio 0-1)\)\.$", help_text), name


def test_several_loaders_get_default_names_and_a_broken_one_does_not_break_the_scrape(server):
    a, b, broken = FakeLoader(batches=1), FakeLoader(batches=2), FakeLoader()
    with pytest.raises(TypeError, match="stats"):
        server.register(object())
    assert server.register(a) == "loader0"
    assert server.register(b) == "loader1"
    assert server.register(broken, name="bad") == "bad"
    with pytest.raises(ValueError, match="already used"):
        server.register(FakeLoader(), name="loader0")
    broken.stats = lambda: 1 / 0  # fails at scrape time: left out, the others still served
    got = scrape(server)
    assert got[("gpufeed_batches_total", frozenset({("loader", "loader0")}))] == 1
    assert got[("gpufeed_batches_total", frozenset({("loader", "loader1")}))] == 2
    assert not series_of(got, "bad")
    assert server.register(a, name="renamed") == "renamed"  # registering again renames
    server.unregister(b)
    server.unregister(FakeLoader())  # not registered: no-op
    assert server.names() == ["renamed", "bad"]
    assert not series_of(scrape(server), "loader1")


# -- lifetime ----------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_dead_loader_disappears_from_the_metrics(server):
    keep, dies = tensor_loader(), tensor_loader()
    for loader in (keep, dies):
        list(loader)
    server.register(keep, name="keep")
    server.register(dies, name="dies")
    assert names_of(scrape(server), "dies") and server.names() == ["keep", "dies"]
    del dies, loader
    gc.collect()
    got = scrape(server)
    assert not series_of(got, "dies")
    assert got[("gpufeed_batches_total", frozenset({("loader", "keep")}))] == keep.stats()["batches"]
    assert server.names() == ["keep"]


@pytest.mark.timeout(60)
def test_second_serve_on_the_same_port_returns_the_same_server(server):
    assert start_server(server.port) is server
    assert start_server(0) is server  # port 0 again: the server it picked
    assert len(metrics_threads()) == 1
    other = start_server(0, addr="localhost")  # another address is another endpoint
    try:
        assert other is not server and other.port != server.port
    finally:
        other.stop()


@pytest.mark.timeout(60)
def test_stop_joins_the_thread_frees_the_port_and_is_idempotent():
    srv = start_server(0)
    port = srv.port
    assert [t.daemon for t in metrics_threads()] == [True]
    srv.stop()
    srv.stop()
    assert srv.stopped and not metrics_threads()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    again = start_server(port)  # the port is free again, and a new server starts on it
    try:
        assert again is not srv and again.port == port and len(metrics_threads()) == 1
    finally:
        again.stop()
    assert not metrics_threads()


def test_a_port_in_use_by_another_program_raises_oserror():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(OSError):
            start_server(sock.getsockname()[1])
    assert not metrics_threads()


@pytest.mark.parametrize("port", [-1, 65536, 1.5, "9400", True, None])
def test_bad_port_is_a_value_error_before_anything_starts(port):
    with pytest.raises(ValueError, match="`port` must be an int in 0-65535"):
        start_server(port)
    assert not metrics_threads()


# -- shipped alerts and dashboard -----------------------------------------------------------------


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def referenced_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\bgpufeed_[a-z_]+", expr))


def test_alerts_parse_and_reference_only_emitted_metrics():
    rules = alert_rules()
    assert {r["alert"] for r in rules} == {
        "GpufeedDataWaitHigh", "GpufeedQueueEmpty", "GpufeedCacheHitRatioFalling",
        "GpufeedWorkerRestarted", "GpufeedErrors", "GpufeedSamplesSkipped",
    }
    used = set()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        names = referenced_metrics(rule["expr"])
        assert names and names <= METRIC_NAMES, (rule["alert"], names - METRIC_NAMES)
        used |= names
    by_name = {r["alert"]: r for r in rules}
    wait = by_name["GpufeedDataWaitHigh"]
    assert wait["for"] == "5m" and "> 0.3" in wait["expr"]
    assert by_name["GpufeedQueueEmpty"]["for"] == "5m"
    assert by_name["GpufeedCacheHitRatioFalling"]["for"] == "15m"
    assert "[10m]" in by_name["GpufeedWorkerRestarted"]["expr"]
    assert "gpufeed doctor" in by_name["GpufeedDataWaitHigh"]["annotations"]["description"]
    assert "num_workers" in by_name["GpufeedQueueEmpty"]["annotations"]["description"]
    assert {"gpufeed_errors_total", "gpufeed_skipped_total", "gpufeed_worker_restarts_total"} <= used


def test_dashboard_is_templated_on_loader_and_queries_only_emitted_metrics():
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert "loader" in variables and variables["loader"]["multi"]
    assert referenced_metrics(variables["loader"]["definition"]) <= METRIC_NAMES
    used = set()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            names = referenced_metrics(expr)
            emitted = METRIC_NAMES | HOST_METRIC_NAMES
            assert names and names <= emitted, (panel["title"], names - emitted)
            for name in names & METRIC_NAMES:  # every per-loader selector is filtered by the loader variable
                assert re.search(rf'{name}\{{loader=~"\$loader"\}}', expr), expr
            # the host cache's gauges have no loader label (a filter would drop them): a panel
            # of host gauges alone, one series per host
            assert not names & HOST_METRIC_NAMES or (names <= HOST_METRIC_NAMES and "loader" not in expr
                                                      and "by (instance)" in expr), expr
            used |= names
    unused = (METRIC_NAMES | HOST_METRIC_NAMES) - used
    assert not unused, f"metrics without a panel: {unused}"
