"""Automatic reads in flight: a local ImageFolder reads one sample at a time while its
reads are fast, and switches to read-ahead by itself when they stall the worker (a network file
system mounted as a local path). Batches never depend on it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop


class LoggedFolder(ImageFolder):
    """An ImageFolder that waits ``delay_s`` before each real read and logs it (thread, start,
    end: monotonic seconds) as one line of ``log_dir/reads-PID``."""

    def __init__(self, root: Path, log_dir: Path, delay_s: float = 0.0, **kw) -> None:
        super().__init__(root, RandomResizedCrop(32, seed=3), **kw)
        self.log_dir, self.delay_s = str(log_dir), delay_s

    def read(self, index: int) -> bytes:
        t0 = time.monotonic()
        if self.delay_s:
            time.sleep(self.delay_s)
        data = super().read(index)
        with open(os.path.join(self.log_dir, f"reads-{os.getpid()}"), "a") as f:
            f.write(f"{threading.current_thread().name} {t0} {time.monotonic()}\n")
        return data


class OffThreadFolder(ImageFolder):
    """An ImageFolder (eval transform, 224 px) that logs the reads made off the worker's main
    thread, as ``log_dir/reads-PID`` lines (the reads on it are left as they are: fast)."""

    def __init__(self, root: Path, log_dir: Path, **kw) -> None:
        super().__init__(root, ResizeCenterCrop(224, 256), **kw)
        self.log_dir = str(log_dir)

    def read(self, index: int) -> bytes:
        name = threading.current_thread().name
        if name != "MainThread":
            with open(os.path.join(self.log_dir, f"reads-{os.getpid()}"), "a") as f:
                f.write(f"{name} 0 0\n")
        return super().read(index)


def _reads(log_dir: Path) -> dict[str, list[tuple[str, float, float]]]:
    """Per worker pid: (thread, start, end) of each read."""
    out = {}
    for path in log_dir.glob("reads-*"):
        rows = [line.split() for line in path.read_text().splitlines()]
        out[path.name] = [(name, float(a), float(b)) for name, a, b in rows]
    return out


def _max_overlap(reads: list[tuple[str, float, float]]) -> int:
    """The most reads running at one moment."""
    events = sorted([(a, 1) for _, a, _ in reads] + [(b, -1) for _, _, b in reads])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def _batches(ds, num_workers: int, stats: dict | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = FastLoader(ds, batch_size=8, num_workers=num_workers, shuffle=True,
                        generator=torch.Generator().manual_seed(5))
    out = [(x.clone(), y.clone()) for x, y in loader]
    if stats is not None:
        stats.update(loader.stats())
    return out


def _same(a, b) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.fixture(scope="module")
def root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=32, size=((60, 80), (70, 90)), seed=2)


@pytest.fixture(scope="module")
def photos(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=32, size=((240, 320), (260, 340)), seed=4)


@pytest.mark.timeout(120)
def test_fast_local_reads_stay_on_the_decoding_thread(photos, tmp_path):
    ds = OffThreadFolder(photos, tmp_path)
    assert ds.read_auto and ds.read_concurrency == 1
    stats: dict = {}
    got = _batches(ds, 2, stats)
    assert stats["reads"] == 64 and stats["read_concurrency_max"] == 1
    assert not _reads(tmp_path)  # every read on the decoding thread: no gpufeed-read thread used
    _same(got, _batches(OffThreadFolder(photos, tmp_path, read_concurrency=1), 2))


@pytest.mark.timeout(120)
def test_slow_reads_switch_to_read_ahead_by_themselves_with_the_same_batches(root, tmp_path):
    auto_log, one_log = tmp_path / "auto", tmp_path / "one"
    auto_log.mkdir()
    one_log.mkdir()
    stats: dict = {}
    got = _batches(LoggedFolder(root, auto_log, delay_s=0.02), 1, stats)
    assert stats["read_concurrency_max"] > 1  # ceil(2 x 20 ms / decode time) + 1, within 2-64
    _same(got, _batches(LoggedFolder(root, one_log, delay_s=0.02, read_concurrency=1), 1))
    (reads,) = _reads(auto_log).values()  # one worker
    assert len(reads) == 64
    assert reads[0][0] == "MainThread"  # it starts one read at a time...
    names = {name.rsplit("-", 1)[0] for name, _, _ in reads}
    assert names == {"MainThread", "gpufeed-read"}, names  # ...then reads ahead on threads
    assert _max_overlap(reads) > 1
    (plain,) = _reads(one_log).values()
    assert _max_overlap(plain) == 1 and {name for name, _, _ in plain} == {"MainThread"}
