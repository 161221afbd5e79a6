"""Reads in flight: one read per sample, read-ahead on threads, fetch_threads.

Results must not depend on read_concurrency: same batches, same errors, same re-runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from gpufeed import FastLoader, ImageDataset, ImageFolder, RandomResizedCrop
from tests._procs import live_children

N = 48


def _jpegs(n: int) -> list[bytes]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        img = rng.integers(0, 255, (40 + i % 5, 56, 3), dtype=np.uint8)
        out.append(cv2.imencode(".jpg", img)[1].tobytes())
    return out


class EncodedItems(Dataset):
    """(JPEG bytes, label) after ``sleep_s``; logs each call (pid, thread, index, in-flight
    bytes) as one line of ``log_dir/PID``; ``bad`` indices return bytes that do not decode;
    ``kill_at``: the first call for that index SIGKILLs its worker (once, by a marker file)."""

    def __init__(self, log_dir: str, sleep_s: float = 0.002, bad: tuple[int, ...] = (),
                 kill_at: int | None = None) -> None:
        self.items, self.log_dir, self.sleep_s = _jpegs(N), log_dir, sleep_s
        self.bad, self.kill_at = set(bad), kill_at
        self._lock: threading.Lock | None = None
        self._in_flight = 0

    def __len__(self) -> int:
        return N

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_lock": None}

    def __getitem__(self, i: int):
        if self._lock is None:
            self._lock = threading.Lock()
        data = b"not an image" if i in self.bad else self.items[i]
        with self._lock:
            self._in_flight += len(data)
            in_flight = self._in_flight
        if i == self.kill_at:
            marker = Path(self.log_dir) / f"died-{i}"
            if not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.sleep_s)
        with self._lock:
            self._in_flight -= len(data)
        with open(Path(self.log_dir) / f"calls-{os.getpid()}", "a") as f:
            f.write(f"{threading.current_thread().name} {i} {in_flight} {time.monotonic()}\n")
        return data, i % 5


def _calls(log_dir: Path, after: float = 0.0) -> list[tuple[str, int, int]]:
    """(thread, index, bytes in flight) of each read (that ended after ``after``, monotonic)."""
    rows = []
    for path in log_dir.glob("calls-*"):
        for line in path.read_text().splitlines():
            name, i, nbytes, *when = line.split()
            if not when or float(when[0]) > after:
                rows.append((name, int(i), int(nbytes)))
    return rows


def _batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def _loader(ds, num_workers: int = 2, **kw) -> FastLoader:
    return FastLoader(ds, batch_size=8, num_workers=num_workers, shuffle=True,
                      generator=torch.Generator().manual_seed(5), **kw)


def _same(a, b) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.timeout(60)
def test_one_getitem_per_sample_and_reads_run_on_named_threads(tmp_path):
    ds = ImageDataset(EncodedItems(str(tmp_path)), RandomResizedCrop(24), read_concurrency=8)
    batches = _batches(_loader(ds))
    assert sum(len(y) for _, y in batches) == N
    calls = _calls(tmp_path)
    assert sorted(i for _, i, _ in calls) == list(range(N))  # each sample read exactly once
    assert {name.rsplit("-", 1)[0] for name, _, _ in calls} == {"gpufeed-read"}


@pytest.mark.timeout(60)
def test_batches_do_not_depend_on_read_concurrency_or_workers(tmp_path):
    results = []
    for rc, workers in ((1, 2), (16, 2), (16, 0)):
        d = tmp_path / f"{rc}-{workers}"
        d.mkdir()
        ds = ImageDataset(EncodedItems(str(d)), RandomResizedCrop(24, seed=9), read_concurrency=rc)
        results.append(_batches(_loader(ds, workers)))
    _same(results[0], results[1])
    _same(results[0], results[2])


@pytest.mark.timeout(60)
def test_image_folder_reads_one_at_a_time_by_default_and_ahead_when_asked_with_the_same_batches(image_folder):
    root = image_folder(num_classes=2, per_class=12, size=((60, 80), (70, 90)), seed=2)
    assert ImageFolder(root).read_concurrency == 1 and ImageFolder(root).read_auto  # auto: starts at 1
    a = _batches(_loader(ImageFolder(root, RandomResizedCrop(32))))
    b = _batches(_loader(ImageFolder(root, RandomResizedCrop(32), read_concurrency=16)))
    _same(a, b)


@pytest.mark.timeout(60)
def test_skip_a_bad_sample_among_concurrent_reads(tmp_path):
    results = []
    for rc in (1, 16):
        d = tmp_path / str(rc)
        d.mkdir()
        ds = ImageDataset(EncodedItems(str(d), bad=(5, 30)), RandomResizedCrop(24),
                          read_concurrency=rc)
        results.append(_batches(_loader(ds, on_error="skip")))
    _same(*results)
    labels = torch.cat([y for _, y in results[1]])
    assert len(labels) == N - 2


@pytest.mark.timeout(60)
def test_bad_sample_raises_with_concurrent_reads(tmp_path):
    ds = ImageDataset(EncodedItems(str(tmp_path), bad=(7,)), RandomResizedCrop(24),
                      read_concurrency=16)
    with pytest.raises(Exception, match="sample index 7"):
        _batches(_loader(ds))


@pytest.mark.timeout(60)
def test_worker_killed_mid_read_yields_every_batch_once(tmp_path):
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "kill"
    ref_dir.mkdir()
    kill_dir.mkdir()
    ref = _batches(_loader(ImageDataset(EncodedItems(str(ref_dir)), RandomResizedCrop(24),
                                        read_concurrency=16)))
    ds = ImageDataset(EncodedItems(str(kill_dir), kill_at=21), RandomResizedCrop(24),
                      read_concurrency=16)
    _same(ref, _batches(_loader(ds)))
    assert (kill_dir / "died-21").exists()


@pytest.mark.timeout(60)
def test_read_threads_and_workers_are_gone_after_shutdown(tmp_path):
    ds = ImageDataset(EncodedItems(str(tmp_path)), RandomResizedCrop(24), read_concurrency=16)
    loader = _loader(ds, persistent_workers=True)
    it = iter(loader)
    next(it)
    assert live_children()
    loader.close()
    deadline = time.monotonic() + 10
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_children()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gpufeed-read")]


def _budgeted(tmp_path) -> tuple[ImageDataset, int, int]:
    """16 slow reads in flight under a budget of three of the largest images: (dataset, largest
    image in bytes, budget in bytes)."""
    biggest = max(map(len, _jpegs(N)))
    budget = 3 * biggest
    ds = ImageDataset(EncodedItems(str(tmp_path), sleep_s=0.01), RandomResizedCrop(24),
                      read_concurrency=16, read_budget_bytes=budget)
    return ds, biggest, budget


@pytest.mark.timeout(60)
def test_read_budget_bounds_bytes_in_flight(tmp_path):
    ds, biggest, budget = _budgeted(tmp_path)
    assert sum(len(y) for _, y in _batches(_loader(ds))) == N
    peak = max(nbytes for _, _, nbytes in _calls(tmp_path))
    assert biggest < peak <= budget  # reads overlapped, within the budget


@pytest.mark.timeout(60)
def test_read_ahead_across_tasks_gives_the_same_batches(tmp_path):
    """Slow reads, so each worker's pipe holds queued tasks whose reads start early; two
    persistent epochs (the second after a Reset) against read_concurrency=1 (no read-ahead),
    and the first against num_workers=0. (Persistent workers' second epoch is compared with
    persistent workers only: like torch, they do not draw a new base seed per epoch.)"""
    results = []
    for rc, workers in ((16, 2), (1, 2), (16, 0)):
        d = tmp_path / f"{rc}-{workers}"
        d.mkdir()
        ds = ImageDataset(EncodedItems(str(d), sleep_s=0.01), RandomResizedCrop(24, seed=4),
                          read_concurrency=rc)
        if workers:
            loader = _loader(ds, workers, prefetch_factor=3, persistent_workers=True)
            results.append(_batches(loader) + _batches(loader))
            loader.close()
            assert sorted(i for _, i, _ in _calls(d)) == sorted(list(range(N)) * 2)  # once per epoch
        else:
            results.append(_batches(_loader(ds, workers)))
    _same(results[0], results[1])
    _same(results[0][: len(results[2])], results[2])


@pytest.mark.timeout(60)
def test_break_mid_epoch_leaves_no_reads_and_no_budget_behind(tmp_path):
    ds, biggest, budget = _budgeted(tmp_path)
    loader = _loader(ds, persistent_workers=True, prefetch_factor=4)
    for _ in loader:
        break  # the workers' queued tasks (and their reads ahead) are left behind
    second = iter(loader)
    first_batch = next(second)
    t = time.monotonic()
    rest = list(second)
    assert len(first_batch[1]) + sum(len(y) for _, y in rest) == N
    later = _calls(tmp_path, after=t)
    peak = max(nbytes for _, _, nbytes in later)
    assert biggest < peak <= budget  # reads still overlap: no budget held by stale reads
    loader.close()
    deadline = time.monotonic() + 10
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_children()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gpufeed-read")]
    ds = ImageDataset(EncodedItems(str(tmp_path)), RandomResizedCrop(24), read_concurrency=16)
    loader = _loader(ds, prefetch_factor=4)
    for _ in loader:
        break  # not persistent: shutdown skips the queued tasks, closing their reads
    del _
    loader.close()
    deadline = time.monotonic() + 10
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_children()


class GatedItems(Dataset):
    """(JPEG bytes, label); each read leaves a ``began-I`` file in ``log_dir``; the read of
    ``gated`` waits (up to 10 s) until the read of ``opener`` has begun, and leaves a
    ``waited-in-vain`` file if it never did."""

    def __init__(self, log_dir: str, gated: int | None = None, opener: int | None = None) -> None:
        self.items, self.log_dir, self.gated, self.opener = _jpegs(N), log_dir, gated, opener

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        (Path(self.log_dir) / f"began-{i}").touch()
        flag = Path(self.log_dir) / f"began-{self.opener}"
        if i == self.gated:
            deadline = time.monotonic() + 10
            while not flag.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            if not flag.exists():
                (Path(self.log_dir) / "waited-in-vain").touch()
        return self.items[i], i % 5


@pytest.mark.timeout(60)
def test_a_task_that_arrives_during_a_fill_begins_its_reads_then(tmp_path):
    """One worker holding two tasks (batches 0 and 1 of 8 samples), 4 reads in flight: read 12
    begins only once the worker fills batch 1; the test then asks for batch 0, so the parent
    sends batch 2's task while batch 1 is filled. Its reads must begin then, not at its turn:
    batch 1's last read (15) finishes only once batch 2's first (16) has begun."""
    kw = dict(batch_size=8, num_workers=1, prefetch_factor=2)
    gated = tmp_path / "gated"
    gated.mkdir()
    ds = ImageDataset(GatedItems(str(gated), gated=15, opener=16), RandomResizedCrop(24, seed=4),
                      read_concurrency=4)
    it = iter(FastLoader(ds, **kw))
    deadline = time.monotonic() + 20
    while not (gated / "began-12").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    got = [(x.clone(), y.clone()) for x, y in it]
    assert not (gated / "waited-in-vain").exists()
    assert (gated / "began-12").exists()
    plain = ImageDataset(GatedItems(str(tmp_path)), RandomResizedCrop(24, seed=4))
    _same(got, _batches(FastLoader(plain, **kw)))

def test_read_options_are_checked():
    with pytest.raises(ValueError, match="`read_concurrency` must be an int >= 1. Found: 0"):
        ImageDataset([(b"x", 0)], read_concurrency=0)
    with pytest.raises(ValueError, match="`read_budget_bytes`"):
        ImageDataset([(b"x", 0)], read_budget_bytes=-1)
    assert ImageDataset([(b"x", 0)]).read_concurrency == 1  # user datasets: only when asked


class ThreadLoggedSquares(Dataset):
    """Thread-safe: (i, i*i); logs the thread of each call."""

    fetch_threads = 4

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        time.sleep(0.002)
        with open(Path(self.log_dir) / f"calls-{os.getpid()}", "a") as f:
            f.write(f"{threading.current_thread().name} {i} 0\n")
        return i, torch.full((3,), float(i * i))


@pytest.mark.timeout(60)
def test_fetch_threads_keeps_order_and_calls_once(tmp_path):
    ds = ThreadLoggedSquares(str(tmp_path))
    got = list(FastLoader(ds, batch_size=6, num_workers=2, shuffle=True,
                          generator=torch.Generator().manual_seed(1)))
    want = list(torch.utils.data.DataLoader(ds, batch_size=6, shuffle=True,
                                            generator=torch.Generator().manual_seed(1)))
    for (a, b), (c, d) in zip(got, want):
        assert torch.equal(a, c) and torch.equal(b, d)
    calls = [(n, i) for n, i, _ in _calls(tmp_path) if n.startswith("gpufeed-fetch")]
    assert sorted(i for _, i in calls) == list(range(40))


class PlainSquares(Dataset):
    """ThreadLoggedSquares without a ``fetch_threads`` attribute."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    __len__ = ThreadLoggedSquares.__len__
    __getitem__ = ThreadLoggedSquares.__getitem__


@pytest.mark.timeout(60)
def test_fetch_threads_is_off_by_default(tmp_path):
    ds = PlainSquares(str(tmp_path))
    got = list(FastLoader(ds, batch_size=6, num_workers=2))
    assert torch.cat([i for i, _ in got]).tolist() == list(range(40))
    calls = _calls(tmp_path)
    assert sorted(i for _, i, _ in calls) == list(range(40))
    assert {name for name, _, _ in calls} == {"MainThread"}  # each worker's own thread


def test_bad_fetch_threads_raises_before_workers_start(tmp_path):
    ds = ThreadLoggedSquares(str(tmp_path))
    ds.fetch_threads = -2
    with pytest.raises(ValueError, match="`fetch_threads` must be an int >= 0. Found: -2"):
        iter(FastLoader(ds, batch_size=4, num_workers=1))
