"""loader.stats() adds up: counts are exact, stage seconds are consistent with wall time."""

from __future__ import annotations

import time

import pytest

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from tests.faults._datasets import Slow

pytestmark = pytest.mark.timeout(60)


def test_generic_counts_and_stage_seconds_add_up():
    delay_s, n, workers = 0.01, 32, 2
    loader = FastLoader(Slow(n, delay_s), batch_size=4, num_workers=workers)
    t0 = time.perf_counter()
    batches = list(loader)
    s = loader.stats()
    wall = time.perf_counter() - t0  # encloses everything the loader timed, stats() included
    assert (s["batches"], s["samples"], s["errors"], s["worker_restarts"]) == (len(batches), n, 0, 0)
    # every sample slept delay_s inside __getitem__: fetch time covers it, and no more than
    # the workers' wall time in parallel could hold
    assert n * delay_s <= s["fetch_s"] <= workers * wall
    assert s["fetch_s"] + s["collate_s"] + s["pack_s"] <= workers * wall
    assert 0 < s["wait_s"] <= s["elapsed_s"] <= wall and 0 < s["data_wait_fraction"] <= 1
    assert s["waits"] == len(batches) + 1  # the last call found the end of the epoch
    assert s["batches_per_s"] > 0


def test_queue_depth_shows_batches_waiting_for_a_slow_consumer():
    loader = FastLoader(Slow(48, 0.0), batch_size=4, num_workers=2, prefetch_factor=2)
    for _ in loader:
        time.sleep(0.05)  # the consumer is the bottleneck: workers fill the queue
    s = loader.stats()
    assert s["queue_depth_mean"] > 2  # of at most prefetch_factor * num_workers = 4
    assert s["data_wait_fraction"] < 0.5


def test_image_path_stage_split_and_counts(image_folder):
    ds = ImageFolder(image_folder(num_classes=2, per_class=24, seed=3), transform=ResizeCenterCrop(64, 72))
    workers = 2
    loader = FastLoader(ds, batch_size=16, num_workers=workers)
    t0 = time.perf_counter()
    n = sum(len(labels) for _, labels in loader)
    s = loader.stats()
    wall = time.perf_counter() - t0
    assert n == len(ds) == s["images"] == s["samples"] and s["skipped"] == 0
    stages = s["read_s"] + s["decode_s"] + s["transform_s"] + s["collate_s"] + s["pack_s"]
    assert s["decode_s"] > 0 and s["transform_s"] > 0 and s["read_s"] > 0
    assert stages <= workers * wall
    assert s["images_per_s"] > 0 and s["cache_hits"] == s["cache_misses"] == 0

