"""Each ImageFiller owns its process's read state (WorkerReads): not a module global, made in the
process that fills, never pickled nor used across a fork, ended by the filler's teardown."""

from __future__ import annotations

import mmap
import os
import pickle
import threading

import pytest
import torch

from gpufeed import ImageFolder
from gpufeed._engine.arena import Arena, SlotWriter
from gpufeed._engine.threads import shutdown_pools
from gpufeed.image import ResizeCenterCrop
from gpufeed.image._fill import FillReport, ImageFiller, ImagePlan, ImageTask, fill_batch

INDICES = [0, 3, 5, 6]


@pytest.fixture(autouse=True)
def _no_threads_left():
    yield
    shutdown_pools()  # this process's gpufeed-read threads, as a worker does on its way out


@pytest.fixture(scope="module")
def root(image_folder):
    return image_folder(num_classes=2, per_class=4, size=((20, 24), (20, 24)), seed=3)


def _plan() -> ImagePlan:
    return ImagePlan(transform=ResizeCenterCrop(size=(8, 8), resize=8))


def _read_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpufeed-read")]


def _fill(filler: ImageFiller, source, indices: list[int], prefetched=None):
    """``filler.fill`` into a real arena slot; returns (images, labels) copied out, the report."""
    arena = Arena(4 * mmap.PAGESIZE, warm_cap=1)
    try:
        slot = arena.acquire()
        w = SlotWriter(arena.handle())
        w.begin(slot)
        try:
            (images, labels), report = filler.fill(source, indices, ImageTask(epoch=0), w, prefetched)
            return (images.clone(), labels.clone()), report
        finally:
            w.end()
    finally:
        arena.close()


def _expected(source, indices: list[int]):
    """The same batch read one sample at a time in this process (as at num_workers=0)."""
    plan = _plan()
    buf = torch.empty(plan.layout(len(indices)).staging, dtype=torch.uint8)
    (images, labels), _ = fill_batch(plan, source, indices, ImageTask(epoch=0), lambda: buf, None)
    return images.clone(), labels.clone()


def test_two_fillers_in_one_process_keep_their_own_read_ahead(root):
    wide, narrow = ImageFolder(root, read_concurrency=4), ImageFolder(root, read_concurrency=2)
    a, b = ImageFiller(_plan()), ImageFiller(_plan())
    open_a = a.prefetch(wide, INDICES, ImageTask(epoch=0))  # a task begun on a's read-ahead
    (images, labels), report = _fill(b, narrow, INDICES)  # b, other settings, fills meanwhile
    assert report.read_concurrency == 2 and report.reads == len(INDICES)
    # With one read-ahead per process, b's settings stopped a's and closed its open task.
    assert a.worker_reads().ahead is not b.worker_reads().ahead
    assert open_a is not None and not open_a.closed
    (images_a, labels_a), report_a = _fill(a, wide, INDICES, open_a)
    assert report_a.read_concurrency == 4 and report_a.reads == len(INDICES)
    want_images, want_labels = _expected(wide, INDICES)
    for got_images, got_labels in ((images, labels), (images_a, labels_a)):
        assert torch.equal(got_images, want_images) and torch.equal(got_labels, want_labels)


def test_automatic_concurrency_is_decided_per_filler(root):
    source = ImageFolder(root)  # read_concurrency=None: auto, one read at a time until a stall
    a, b = ImageFiller(_plan()), ImageFiller(_plan())
    assert a.worker_reads().for_source(source) is None and b.worker_reads().for_source(source) is None
    stalled = FillReport(kept=list(range(8)), read_s=8 * 5e-3, reads=8, read_latency_s=8 * 5e-3,
                         decode_s=8e-3)  # 5 ms reads against 1 ms decodes, twice: a switches
    for _ in range(2):
        a.worker_reads().observe(source, stalled)
    ahead = a.worker_reads().for_source(source)
    assert ahead is not None and ahead.concurrency == 11  # ceil(2 x 5 / 1) + 1
    assert b.worker_reads().for_source(source) is None  # b's reads never stalled
    _, report = _fill(a, source, INDICES)
    assert report.read_concurrency == 11


def test_a_pickled_filler_carries_its_plan_and_no_read_state(root):
    source = ImageFolder(root, read_concurrency=4)
    filler = ImageFiller(_plan())
    _fill(filler, source, INDICES)
    assert filler.worker_reads().ahead is not None and _read_threads()
    copy = pickle.loads(pickle.dumps(filler))  # as a spawned worker gets it
    assert copy == filler and copy.plan == filler.plan
    assert copy.worker_reads() is not filler.worker_reads()
    assert copy.worker_reads().ahead is None and copy.worker_reads().auto is None
    (images, labels), report = _fill(copy, source, INDICES)
    assert report.read_concurrency == 4 and copy.worker_reads().ahead is not filler.worker_reads().ahead
    want_images, want_labels = _expected(source, INDICES)
    assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


@pytest.mark.timeout(60)
def test_a_forked_filler_makes_its_own_read_state(root):
    source = ImageFolder(root, read_concurrency=4)
    filler = ImageFiller(_plan())
    _fill(filler, source, INDICES)
    parent_reads = filler.worker_reads()
    left_open = filler.prefetch(source, [1, 2], ImageTask(epoch=0))  # open at fork
    want_images, want_labels = _expected(source, INDICES)
    pid = os.fork()
    if pid == 0:  # the child (a forked worker): exit status 0 if it read with state of its own
        ok = False
        try:
            mine = filler.worker_reads()
            (images, labels), report = _fill(filler, source, INDICES)
            ok = (mine is not parent_reads and mine.pid == os.getpid() and report.reads == 4
                  and mine.ahead is not parent_reads.ahead and report.read_concurrency == 4
                  and torch.equal(images, want_images) and torch.equal(labels, want_labels))
            filler.teardown()
            ok = ok and not _read_threads()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert filler.worker_reads() is parent_reads  # the parent's state and reads are untouched
    assert left_open is not None and [left_open.next()[1] for _ in range(2)] == [
        source.label(1), source.label(2)]
    left_open.close()


def test_teardown_ends_the_read_threads_and_a_later_task_starts_new_ones(root):
    source = ImageFolder(root, read_concurrency=4)
    filler = ImageFiller(_plan())
    _fill(filler, source, INDICES)
    assert len(_read_threads()) == 4
    filler.teardown()  # the worker leaves its task loop
    assert not _read_threads()
    filler.teardown()  # idempotent
    (images, labels), report = _fill(filler, source, INDICES)
    assert report.read_concurrency == 4 and len(_read_threads()) == 4
    want_images, want_labels = _expected(source, INDICES)
    assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_a_filler_never_used_tears_down_cleanly():
    ImageFiller(_plan()).teardown()
    assert not _read_threads()
