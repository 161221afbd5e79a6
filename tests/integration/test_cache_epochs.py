"""Cached epochs without workers: batches whose every row is a decoded-cache hit are
completed in the main process, and workers start only for a batch with a miss.

Every test checks bytes against an uncached loader, and processes with psutil.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch.utils.data import Sampler

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from tests._concurrent import result
from tests._folders import ImageFolders
from tests._procs import live_children

from ._datasets import IndexDataset

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
NUM_IMAGES = 40  # 2 classes x 20; batches of 8
BATCH = 8
EVAL = ResizeCenterCrop(40, 48)
ROW_BYTES = 40 * 40 * 3
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    return _make_root(tmp_path_factory)


class ReverseOddEpochs(Sampler[int]):
    """0..n-1 in even passes, n-1..0 in odd ones: after a pass with a cache of k rows (LRU), the
    next pass starts with the k rows it kept (full hits), then a mixed batch, then misses."""

    def __init__(self, n: int) -> None:
        self.n, self.passes = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = range(self.n) if self.passes % 2 == 0 else range(self.n - 1, -1, -1)
        self.passes += 1
        return iter(order)


def folder(root: Path) -> ImageFolder:
    return ImageFolder(root, transform=EVAL)


def batches(iterable) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in iterable]


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert gx.dtype == wx.dtype and gx.shape == wx.shape and gx.stride() == wx.stride()
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


@pytest.mark.parametrize("output", [{}, {"channels_last": True}])
def test_fully_cached_epoch_starts_no_worker_and_is_byte_identical(image_root, output):
    loader = FastLoader(folder(image_root), batch_size=BATCH, num_workers=2, cache_bytes="16MB", **output)
    cold_iter = iter(loader)
    cold = batches(cold_iter)
    assert cold_iter.workers_started == 2
    assert live_children() == []  # the cold epoch's workers stopped at its end
    it = iter(loader)
    warm = []
    for x, y in it:
        assert live_children() == []  # nothing forked while the cached epoch runs
        warm.append((x.clone(), y.clone()))
    assert it.workers_started == 0 and it.worker_pids == []
    assert_same(warm, cold)
    stats = loader.stats()
    assert stats["parent_batches"] == len(cold)  # counted as batches no worker touched
    assert stats["parent_s"] > 0
    assert stats["batches"] == 2 * len(cold) and stats["samples"] == 2 * NUM_IMAGES
    assert stats["cache_hits"] == NUM_IMAGES and stats["images"] == 2 * NUM_IMAGES
    loader.close()


def test_full_hit_batches_are_made_in_the_slot_freed_last(image_root):
    """A full-hit batch is made as it is handed out, in the slot freed last: a consumer that
    drops each batch before asking for the next gets every cached batch in one slot (warm pages,
    often still in the CPU caches), and one that holds a batch while asking, in two; the arena
    keeps only those slots' pages (plus the cold epoch's), whatever the prefetch depth."""
    loader = FastLoader(folder(image_root), batch_size=BATCH, num_workers=2, cache_bytes="16MB",
                        prefetch_factor=4)
    cold = batches(loader)
    arena = loader._arena
    slots_after_cold = arena.num_slots
    emptied = arena.emptied
    for _ in range(3):
        got, places = [], set()
        for x, y in loader:  # dropped before the next batch is asked for
            places.add(x.untyped_storage().data_ptr() + x.storage_offset())
            got.append((x.clone(), y.clone()))
            del x, y
        assert_same(got, cold)
        assert len(places) == 1
    held, places = None, set()
    got = []
    for batch in loader:  # the previous batch is still held while the next one is made
        places.add(batch[0].untyped_storage().data_ptr() + batch[0].storage_offset())
        got.append((batch[0].clone(), batch[1].clone()))
        held = batch  # noqa: F841 (held on purpose)
    del held, batch
    assert_same(got, cold)
    assert len(places) == 2
    assert arena.num_slots == slots_after_cold  # no slot made for cached epochs
    stats = loader.stats()
    assert stats["parent_batches"] == 4 * len(cold) and stats["cache_hits"] == 4 * NUM_IMAGES
    assert arena.emptied >= emptied  # (surplus warm slots of the cold epoch may be trimmed)
    loader.close()


def test_cached_rows_are_aligned_and_a_row_evicted_after_the_look_up_is_still_copied(image_root):
    """Decoded rows are cached 64-byte aligned; a full-hit batch keeps the rows it found at
    submission, so one evicted before the batch is handed out still lands in the batch."""
    loader = FastLoader(folder(image_root), batch_size=BATCH, num_workers=2, cache_bytes="16MB")
    cold = batches(loader)
    feed = loader._image_feed
    rows = [feed.cache.peek(i) for i in range(NUM_IMAGES)]
    assert all(r is not None and r.nbytes == ROW_BYTES and r.ctypes.data % 64 == 0 for r in rows)
    it = iter(loader)  # the first prefetch_factor x num_workers batches are looked up now
    feed.cache.clear()  # ...and evicted before any is handed out
    got = []
    for x, y in it:
        got.append((x.clone(), y.clone()))
    # the 4 batches looked up before the clear were made from the rows they found; the last one
    # missed, went to a worker, and its rows were cached again
    assert_same(got, cold)
    stats = loader.stats()
    assert stats["parent_batches"] == 4 and stats["cache_misses"] >= BATCH
    assert len(feed.cache) == BATCH
    loader.close()


@pytest.mark.parametrize("output", [{"normalize": (MEAN, STD)},
                                    {"normalize": (MEAN, STD), "channels_last": True},
                                    {"dtype": torch.float16}])
@pytest.mark.parametrize("persistent", [False, True])
def test_float_batches_of_cache_hits_still_go_to_workers(image_root, output, persistent):
    # their dtype pass runs on the workers in parallel (serially in the main process it was
    # slower than starting the workers: benchmarks/cache_epochs.py); bytes are unchanged
    loader = FastLoader(folder(image_root), batch_size=BATCH, num_workers=2, cache_bytes="16MB",
                        persistent_workers=persistent, **output)
    cold = batches(loader)
    assert_same(batches(loader), cold)
    stats = loader.stats()
    assert stats["parent_batches"] == 0 and stats["cache_hits"] == NUM_IMAGES
    loader.close()


@pytest.mark.timeout(120)
def test_full_hit_batches_of_two_sizes_match_an_uncached_loader_over_epochs(image_root):
    """Batches the main process makes are packed once per batch size (a full one and the last,
    partial one: 40 = 6 x 6 + 4) and that packing is reused by later iterators; the rows come
    from the cache in each epoch's order, the labels from the dataset's label table."""
    ds = folder(image_root)
    cached = FastLoader(ds, batch_size=6, num_workers=2, cache_bytes="16MB", sampler=ReverseOddEpochs(NUM_IMAGES))
    plain = FastLoader(ds, batch_size=6, num_workers=0, sampler=ReverseOddEpochs(NUM_IMAGES))
    for _ in range(4):
        want = batches(plain)
        assert [len(y) for _, y in want] == [6] * 6 + [4]
        assert_same(batches(cached), want)
    assert cached.stats()["parent_batches"] == 3 * 7  # every epoch after the first
    cached.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_mixed_epochs_match_an_uncached_loader_in_order(image_root, persistent):
    ds = folder(image_root)
    k = NUM_IMAGES // 2 + 4  # the cache keeps 24 rows: 3 full-hit batches in passes 1 and 2
    cached = FastLoader(ds, batch_size=BATCH, num_workers=2, cache_bytes=k * ROW_BYTES,
                        sampler=ReverseOddEpochs(NUM_IMAGES), persistent_workers=persistent)
    plain = FastLoader(ds, batch_size=BATCH, num_workers=0, sampler=ReverseOddEpochs(NUM_IMAGES))
    parent = []
    for _ in range(3):
        assert_same(batches(cached), batches(plain))
        parent.append(cached.stats()["parent_batches"])
    assert parent == [0, 3, 6]  # (cumulative) pass 2 finds rows 0..23, what pass 1 left
    assert cached.stats()["cache_hits"] > 0 and cached.stats()["cache_misses"] > NUM_IMAGES
    cached.close()
    assert live_children() == []


def test_in_order_false_yields_every_batch_once(image_root):
    ds = folder(image_root)
    k = NUM_IMAGES // 2 + 4
    cached = FastLoader(ds, batch_size=BATCH, num_workers=2, cache_bytes=k * ROW_BYTES, in_order=False,
                        sampler=ReverseOddEpochs(NUM_IMAGES))
    plain = FastLoader(ds, batch_size=BATCH, num_workers=0, sampler=ReverseOddEpochs(NUM_IMAGES))
    for _ in range(2):
        got = sorted(x.numpy().tobytes() + y.numpy().tobytes() for x, y in batches(cached))
        want = sorted(x.numpy().tobytes() + y.numpy().tobytes() for x, y in batches(plain))
        assert got == want  # the same batches, each once, in whatever order they came
    assert cached.stats()["parent_batches"] == 3


def test_generic_datasets_still_start_every_worker_at_iter():
    # torch starts all workers at iter(); worker_init_fn runs even for a worker given no batch
    loader = FastLoader(IndexDataset(3), batch_size=4, num_workers=2)
    it = iter(loader)
    assert it.workers_started == 2 and len(it.worker_pids) == 2
    assert [b[0].tolist() for b in it] == [[0, 1, 2]]


def _wait_dead(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} still alive {timeout_s} s after SIGKILL")


def test_worker_death_in_a_mixed_epoch_reruns_its_batches(image_root):
    ds = folder(image_root)
    k = NUM_IMAGES // 2 + 4
    cached = FastLoader(ds, batch_size=2, num_workers=2, cache_bytes=k * ROW_BYTES, prefetch_factor=4,
                        sampler=ReverseOddEpochs(NUM_IMAGES), persistent_workers=True)
    plain = FastLoader(ds, batch_size=2, num_workers=0, sampler=ReverseOddEpochs(NUM_IMAGES))
    assert_same(batches(cached), batches(plain))  # fills the cache
    it = iter(cached)
    got, killed = [], 0
    for i, (x, y) in enumerate(it):
        got.append((x.clone(), y.clone()))
        if i in (12, 13):  # past the 12 full hits: each worker owes misses
            pid = it.worker_pids[i % 2]
            os.kill(pid, signal.SIGKILL)
            killed += 1
            _wait_dead(pid)  # so the next __next__ sees its sentinel, whatever it still owes
    assert_same(got, batches(plain))
    assert killed == 2
    assert cached.stats()["parent_batches"] == k // 2
    # A worker killed after it had sent everything it owed is seen dead at a later poll, which
    # may be the next epoch's (on a loaded host both were: 0 restarts counted in this one); it
    # is never lost: by the end of the next epoch both are replaced, and its batches are right.
    assert_same(batches(cached), batches(plain))
    assert cached.stats()["worker_restarts"] == 2
    cached.close()
    assert live_children() == []


def test_resume_is_exact_with_cache_hits(image_root):
    def make() -> FastLoader:
        return FastLoader(folder(image_root), batch_size=4, num_workers=2, shuffle=True, seed=3,
                          cache_bytes="16MB", generator=torch.Generator().manual_seed(5))

    loader = make()
    batches(loader)
    full = batches(loader)  # epoch 1: every batch from the cache
    loader = make()
    batches(loader)
    head = []
    for i, (x, y) in enumerate(loader):
        head.append((x.clone(), y.clone()))
        if i == 2:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    assert_same(head, full[:3])
    resumed = make()  # a fresh loader: empty cache, so the rest comes from workers
    resumed.load_state_dict(state)
    assert_same(batches(resumed), full[3:])
    # and a loader whose cache is full resumes exactly too (hits served in the parent)
    warm = make()
    batches(warm)
    warm.load_state_dict(state)
    assert_same(batches(warm), full[3:])
    assert warm.stats()["parent_batches"] == len(full) - 3


_SHUTDOWN = textwrap.dedent("""
    import gc, json, sys
    from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
    from tests._procs import gpufeed_memfds, live_children
    from tests.integration.test_cache_epochs import ReverseOddEpochs
    ds = ImageFolder(sys.argv[1], transform=ResizeCenterCrop(40, 48))
    out = {}
    for scenario, stop_at in (("break_cached", 3), ("break_mixed", 15), ("exception", 15), ("del", 15)):
        loader = FastLoader(ds, batch_size=2, num_workers=2, cache_bytes=24 * 40 * 40 * 3,
                            sampler=ReverseOddEpochs(40))
        list(loader)      # forward: the cache keeps rows 16..39
        it = iter(loader) # backwards: 12 full-hit batches, then misses
        try:
            for i, batch in enumerate(it):
                if i == stop_at:
                    if scenario == "exception":
                        raise KeyError("boom")
                    break
        except KeyError:
            pass
        started = it.workers_started
        del batch  # a batch the user keeps keeps its mapping (and its descriptor) open
        if scenario == "del":
            del it
            gc.collect()
        else:
            it = None  # break / exception: the loop's iterator dies with its last reference
        during = len(live_children())
        loader.close()
        out[scenario] = {"started": started, "children": during, "memfds": len(gpufeed_memfds())}
    print(json.dumps(out))
""")


def _make_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ImageFolders(tmp_path_factory)(num_classes=2, per_class=20, size=((90, 120), (100, 140)), seed=13)


def _shutdown_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    root = _make_root(tmp_path_factory)  # its own copy of image_root's folder
    return subprocess.run([sys.executable, "-c", _SHUTDOWN, str(root)], cwd=ROOT, capture_output=True, text=True,
                          timeout=100)  # fmt: skip


SIDE_BY_SIDE = {"cache-epochs-shutdown": (3.3, _shutdown_run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_shutdown_leaves_no_process_or_memfd(side_by_side):
    proc = result(side_by_side, "cache-epochs-shutdown")
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    for scenario, left in state.items():
        assert left["children"] == 0 and left["memfds"] == 0, scenario
        # a break among the full hits started no worker; past them, workers were started
        assert (left["started"] == 0) == (scenario == "break_cached"), scenario


def test_doctor_counts_the_batches_the_main_process_made(image_root):
    from gpufeed.doctor import diagnose

    with FastLoader(folder(image_root), batch_size=4, num_workers=2, cache_bytes="16MB") as loader:
        batches(loader)  # cold: fills the cache
        report = diagnose(loader, batches=6, warmup_batches=1, replay_batches=2, sample_interval_s=0.02)
    # counted when made (at dispatch, prefetch ahead), as worker batches are when they arrive
    assert 4 <= report.evidence.parent_batches <= 6 + 4 and report.evidence.parent_s > 0
    assert report.evidence.samples == 4 * report.evidence.parent_batches  # no worker batch
    assert "made by the main process from the cache" in str(report)
    # no worker made a batch, so no worker-side verdict (it was "workers: persistent_workers")
    assert report.bottleneck in ("cache", "compute"), str(report)
