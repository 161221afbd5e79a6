"""Automatic reads in flight: the rule each worker applies after each task."""

from __future__ import annotations

import pytest

from gpufeed import ImageDataset, ImageFolder, LMDBDataset, pack
from gpufeed.image._auto_reads import MAX_CONCURRENCY, AutoReads, auto_concurrency
from gpufeed.tune._reads import read_options


def test_page_cached_reads_stay_sequential():
    auto = AutoReads()
    for _ in range(50):  # 8 reads of 40 us against 8 decodes of 1 ms, task after task
        assert auto.observe(8 * 40e-6, 8, 8 * 40e-6, 8 * 1e-3, 8) == 1
    assert auto.concurrency == 1


def test_one_slow_task_is_not_enough():
    auto = AutoReads()
    assert auto.observe(8 * 20e-3, 8, 8 * 20e-3, 8e-3, 8) == 1  # a cold first task
    assert auto.observe(8 * 40e-6, 8, 8 * 40e-6, 8e-3, 8) == 1  # then page-cached again
    assert auto.observe(8 * 20e-3, 8, 8 * 20e-3, 8e-3, 8) == 1  # the count started again


def test_stalling_reads_switch_once_to_a_concurrency_covering_the_latency():
    auto = AutoReads()
    auto.observe(8 * 5e-3, 8, 8 * 5e-3, 8e-3, 8)  # 5 ms reads, 1 ms decode
    assert auto.observe(8 * 5e-3, 8, 8 * 5e-3, 8e-3, 8) == 11  # ceil(2 x 5 / 1) + 1
    # decided for good: neither faster nor slower tasks change it
    assert auto.observe(0.0, 8, 8 * 1e-4, 8e-3, 8) == 11
    assert auto.observe(8 * 0.1, 8, 8 * 0.1, 8e-3, 8) == 11


def test_reads_at_half_the_decode_stall_and_below_do_not():
    below, at = AutoReads(), AutoReads()
    for _ in range(3):
        below.observe(8 * 0.49e-3, 8, 8 * 0.49e-3, 8e-3, 8)
        at.observe(8 * 0.5e-3, 8, 8 * 0.5e-3, 8e-3, 8)
    assert below.concurrency == 1
    assert at.concurrency == 2  # ceil(2 x 0.5 / 1) + 1


def test_tasks_without_reads_or_kept_samples_are_ignored():
    auto = AutoReads()
    for _ in range(3):
        auto.observe(1.0, 0, 0.0, 8e-3, 8)  # every sample came from the cache
        auto.observe(1.0, 8, 1.0, 0.0, 0)  # every sample failed to decode
    assert auto.concurrency == 1


@pytest.mark.parametrize(("latency", "work", "want"), [
    (40e-6, 1e-3, 2), (5e-3, 1e-3, 11), (30e-3, 1e-3, 61), (100e-3, 1e-3, MAX_CONCURRENCY),
    (1.0, 0.0, MAX_CONCURRENCY)])
def test_auto_concurrency_is_clamped(latency, work, want):
    assert auto_concurrency(latency, work) == want


def test_defaults_auto_for_own_local_sources_only(image_folder, tmp_path):
    root = image_folder(num_classes=2, per_class=2, size=((20, 24), (20, 24)), seed=1)
    folder = ImageFolder(root)
    assert folder.read_auto and folder.read_concurrency == 1
    assert read_options(folder) == (None, folder.read_budget_bytes)  # restored as auto by tune
    explicit = ImageFolder(root, read_concurrency=1)
    assert not explicit.read_auto and read_options(explicit) == (1, explicit.read_budget_bytes)
    assert not ImageFolder(root, read_concurrency=16).read_auto
    pack(root, tmp_path / "db.lmdb")
    assert LMDBDataset(tmp_path / "db.lmdb").read_auto
    assert not LMDBDataset(tmp_path / "db.lmdb", read_concurrency=4).read_auto
    assert ImageDataset(folder.samples).read_auto  # a samples list of local paths: as a folder
    user = ImageDataset([(b"x", 0)])  # a user dataset: one read at a time unless asked
    assert not user.read_auto and user.read_concurrency == 1
    folder.set_read_options(4, 1 << 20)  # an explicit value ends auto
    assert not folder.read_auto and folder.read_concurrency == 4
    folder.set_read_options(None, 1 << 20)
    assert folder.read_auto and folder.read_concurrency == 1
