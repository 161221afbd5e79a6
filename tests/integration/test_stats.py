"""loader.stats() adds up: counts are exact, stage seconds are consistent with wall time."""

from __future__ import annotations

import os
import time

import pytest

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.doctor._probe import thread_states
from tests.faults._datasets import Marked, Slow

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


def _sent(loader: FastLoader, marker_dir: str, fetched: int) -> bool:
    """Whether the workers have fetched ``fetched`` samples and are all waiting (S) for work: the
    batches of those samples are on their way to the loader, not being collated or packed."""
    return (len(os.listdir(marker_dir)) >= fetched
            and all(thread_states(pid)[0] == "S" for pid in loader.worker_pids()))


def test_queue_depth_shows_batches_waiting_for_a_slow_consumer(tmp_path):
    n, batch_size, in_flight = 48, 4, 4  # prefetch_factor * num_workers tasks in flight
    loader = FastLoader(Marked(n, str(tmp_path)), batch_size=batch_size, num_workers=2, prefetch_factor=2)
    batches = n // batch_size
    for taken, _ in enumerate(loader, 1):
        # The consumer is the bottleneck: before asking for the next batch it waits until the
        # workers have made every task in flight (the first `taken` batches and up to 4 more),
        # so each __next__ finds them ready; no clock decides it.
        fetched = batch_size * min(batches, taken + in_flight)
        deadline = time.monotonic() + 30  # a hang guard only
        while not _sent(loader, str(tmp_path), fetched):
            assert time.monotonic() < deadline, f"{len(os.listdir(tmp_path))} of {fetched} samples fetched"
            time.sleep(0.001)
    s = loader.stats()
    assert s["waits"] == batches + 1 and s["queue_depth"] == 0  # the last call found the epoch's end
    # ready at each __next__: 0 (start), 4 x 8, then 3, 2, 1, 0 as the epoch runs out: 38 / 13
    # (measured: 37-38; a batch sent but not yet readable would count one less)
    assert s["queue_depth_mean"] > 2  # of at most prefetch_factor * num_workers = 4


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

