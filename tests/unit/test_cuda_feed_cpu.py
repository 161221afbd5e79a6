"""The CUDA feed's ordering, checked without a GPU.

``CudaFeed`` makes every CUDA call through one ``CudaOps`` object and ``HostRegistrar`` through
``cudart``; here both are stand-ins that record the calls, with a fake "GPU" whose events
complete only when the test says so. Everything else is gpufeed's own code: a real ``Arena``
whose slots hold the host batches, the real registrar, feed and iterator. What is checked is
observable: the order of the calls, which slots are free, which batches are held.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
import weakref

import pytest
import torch

from gpufeed._engine.arena import Arena
from gpufeed._engine.context import EngineContext
from gpufeed.config import EngineConfig
from gpufeed.cuda._feed import CudaFeed, hand_out
from gpufeed.serve._images import _Runner
from gpufeed.stats import Stats

SLOT = 1 << 20
N = 6  # batches per epoch
SYNCS = ("stream.synchronize", "event.synchronize")


class Gpu:
    """The fake device: a log of every call, the registered host ranges, the events."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.ranges: dict[int, int] = {}  # registered address -> bytes
        self.events: list[Event] = []
        self.current = [0]  # the current device (a stack: ``Ops.use_device`` pushes), 0 as in CUDA
        self.page_locks: list[tuple[str, int]] = []  # (call, the device current at it)
        self.on_unregister = lambda ptr: None  # what a test looks at before a range is unlocked
        self.copy_streams: list[Stream] = []  # every copy stream made (``Ops.new_stream``)
        self.stream_delay_s = 0.0  # how long making a stream takes (a test widens a race with it)

    def done(self, upto: int | None = None) -> None:
        """Complete the first ``upto`` events recorded (all by default), as the GPU would."""
        for e in self.events[:upto]:
            e.done = True

    def syncs(self) -> list[tuple]:
        return [c for c in self.log if c[0] in SYNCS]

    # cudart, as HostRegistrar calls it
    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
        self.log.append(("cudaHostRegister", ptr))
        self.page_locks.append(("cudaHostRegister", self.current[-1]))
        self.ranges[ptr] = nbytes
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        copy_streams = {e.stream for e in self.events if e.stream is not None and e.stream.name == "copy"}
        drained = all(e.done for e in self.events if e.stream in copy_streams)
        self.log.append(("cudaHostUnregister", ptr, drained))
        self.page_locks.append(("cudaHostUnregister", self.current[-1]))
        self.on_unregister(ptr)
        del self.ranges[ptr]
        return 0

    def pinned(self, t: torch.Tensor) -> bool:
        p = t.data_ptr()
        return any(a <= p < a + n for a, n in self.ranges.items()) or getattr(t, "_torch_pinned", False)


class Event:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu, self.done, self.stream = gpu, False, None
        gpu.events.append(self)

    def record(self, stream: Stream) -> None:
        self.stream = stream
        self.gpu.log.append(("record", stream.name, self.gpu.events.index(self)))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.gpu.log.append(("event.synchronize",))
        self.done = True

    def elapsed_time(self, end: Event) -> float:
        assert self.done and end.done, "elapsed_time of an event that has not completed"
        return 2.0


class Stream:
    def __init__(self, gpu: Gpu, name: str) -> None:
        self.gpu, self.name = gpu, name

    def wait_stream(self, other: Stream) -> None:
        self.gpu.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: Event) -> None:
        self.gpu.log.append(("wait_event", self.name, self.gpu.events.index(event)))

    def synchronize(self) -> None:
        self.gpu.log.append(("stream.synchronize", self.name))
        for e in self.gpu.events:
            if e.stream is self:
                e.done = True


class Ops:
    """``gpufeed.cuda._feed.CudaOps`` for the fake GPU; device tensors are CPU clones. As in CUDA,
    the current stream is per thread, and every thread starts on the one default stream."""

    def __init__(self, gpu: Gpu, index: int = 0) -> None:
        self.gpu = gpu
        self.index = index  # the loader's device, as far as ``use_device`` is concerned
        self.device = torch.device("cpu")
        self.default = Stream(gpu, "default")
        self._local = threading.local()

    @property
    def streams(self) -> list[Stream]:
        """The calling thread's stack of current streams."""
        if not hasattr(self._local, "streams"):
            self._local.streams = [self.default]
        return self._local.streams

    def new_stream(self) -> Stream:
        time.sleep(self.gpu.stream_delay_s)
        stream = Stream(self.gpu, "copy")
        self.gpu.copy_streams.append(stream)
        return stream

    def new_consumer_stream(self) -> Stream:
        return Stream(self.gpu, f"consumer-{threading.current_thread().name}")

    def default_stream(self) -> Stream:
        return self.default

    def current_stream(self) -> Stream:
        return self.streams[-1]

    @contextlib.contextmanager
    def use_stream(self, stream: Stream):
        self.streams.append(stream)
        try:
            yield stream
        finally:
            self.streams.pop()

    @contextlib.contextmanager
    def use_device(self):
        self.gpu.current.append(self.index)
        try:
            yield
        finally:
            self.gpu.current.pop()

    def new_event(self) -> Event:
        return Event(self.gpu)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return self.gpu.pinned(t)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        self.gpu.log.append(("pin",))
        self.gpu.page_locks.append(("pin", self.gpu.current[-1]))
        out = t.clone()
        out._torch_pinned = True  # type: ignore[attr-defined]
        return out

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        self.gpu.log.append(("copy", self.current_stream().name, self.gpu.pinned(t)))
        return t.clone()

    def record_stream(self, t: torch.Tensor, stream: Stream) -> None:
        self.gpu.log.append(("record_stream", stream.name))


_OPEN_ARENAS: list[Arena] = []  # closed after each test (their memfds must not outlive it)


@pytest.fixture(autouse=True)
def _close_arenas():
    yield
    while _OPEN_ARENAS:
        _OPEN_ARENAS.pop().close()


class Host:
    """Host batches as the engine makes them: views of leased arena slots, page-locked by the
    registrar before they are handed out; a slot is free again when its views die."""

    def __init__(self, gpu: Gpu, feed: CudaFeed) -> None:
        self.arena = Arena(SLOT, warm_cap=N + 2)
        _OPEN_ARENAS.append(self.arena)
        self.registrar = feed.registrar(self.arena, cudart=gpu)
        self.batches: list[weakref.ref] = []

    def epoch(self, n: int = N, pageable: bool = False):
        self.arena.attach()  # as an engine does: the arena stays open until it detaches
        try:
            for k in range(n):
                yield self._batch(k, pageable)  # not kept in a local while the generator waits
        finally:
            self.arena.detach()

    def _batch(self, k: int, pageable: bool) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.arena.acquire()
        self.registrar.ensure(slot, 4096)
        view = torch.frombuffer(self.arena.lease(slot, 4096), dtype=torch.uint8)
        view.fill_(k)
        images = view[: 3 * 8 * 8].view(1, 3, 8, 8)
        labels = torch.full((1,), k) if pageable else view[256:264].view(torch.int64)
        self.batches.append(weakref.ref(images))
        return images, labels

    def free(self) -> int:
        return self.arena.free_slots()


@pytest.fixture
def gpu():
    return Gpu()


@pytest.fixture
def feed(gpu):
    return CudaFeed(torch.device("cpu"), prefetch_batches=2, stats=Stats(), ops=Ops(gpu))


def test_steady_state_copies_on_the_copy_stream_and_never_waits_on_the_host(gpu, feed):
    host = Host(gpu, feed)
    got = []
    for k, (images, _labels) in enumerate(feed.wrap(host.epoch())):
        got.append(int(images[0, 0, 0, 0]))
        gpu.done(upto=2 * k)  # the GPU lags: copies complete a batch or two after they were issued
    assert got == list(range(N))
    assert gpu.syncs() == []  # not per batch, not at the end of the epoch
    copies = [c for c in gpu.log if c[0] == "copy"]
    assert copies == [("copy", "copy", True)] * (2 * N)  # on the copy stream, from page-locked memory
    # before each copy the copy stream waits for the consumer; the consumer waits for each end event
    assert [c for c in gpu.log if c[0] == "wait_stream"] == [("wait_stream", "copy", "default")] * N
    ends = [c[2] for c in gpu.log if c[0] == "wait_event"]
    assert ends == [2 * k + 1 for k in range(N)] and all(e.stream.name == "copy" for e in gpu.events)
    assert [c for c in gpu.log if c[0] == "record_stream"] == [("record_stream", "default")] * (2 * N)


def test_a_host_batch_is_kept_until_its_copy_event_completed(gpu, feed):
    host = Host(gpu, feed)
    it = feed.wrap(host.epoch())
    first = next(it)
    assert host.free() == 0 and feed.pending == 3  # the 3 issued copies may still run: slots held
    gpu.done(upto=2)  # batch 0's copy (start and end event) completed
    assert host.batches[0]() is not None  # nothing polled yet
    second = next(it)
    assert host.free() == 1 and host.batches[0]() is None  # released at the next poll
    assert feed.pending == 3 and all(ref() is not None for ref in host.batches[1:])
    assert first[0].sum() == 0 and second[0].max() == 1
    for _ in it:
        pass
    assert feed.pending == N - 1 and host.free() == 1  # the end of the epoch waits for nothing...
    gpu.done()
    feed.retire()  # ...the next epoch's first __next__ polls them
    assert feed.pending == 0 and host.free() == N
    assert feed.stats.h2d_s == pytest.approx(N * 2.0 / 1000)


def test_closing_the_arena_with_copies_queued_drains_the_copy_stream_before_unregistering(gpu, feed):
    """The end of an epoch closes the arena when the loader was closed meanwhile (the engine
    detaches): the copies of the last batches are still queued on the copy stream."""
    host = Host(gpu, feed)
    it = feed.wrap(host.epoch())
    next(it)
    host.arena.close()  # loader.close() during the epoch: deferred until the engine detaches
    assert not any(c[0] == "cudaHostUnregister" for c in gpu.log)
    rest = list(it)  # the host iterator ends: the arena closes with copies still queued
    assert len(rest) == N - 1
    calls = [c for c in gpu.log if c[0] in ("stream.synchronize", "cudaHostUnregister")]
    assert calls[0] == ("stream.synchronize", "copy")
    unregisters = calls[1:]
    assert len(unregisters) == N and all(drained for _, _, drained in unregisters)
    assert feed.pending == 0 and gpu.ranges == {}


def test_a_dropped_iterator_waits_for_nothing_and_keeps_its_slots_until_the_copies_ran(gpu, feed):
    host = Host(gpu, feed)
    it = feed.wrap(host.epoch())
    next(it), next(it)
    del it  # ``break`` with copies queued
    gc.collect()
    assert gpu.syncs() == []
    assert feed.pending == 4 and host.free() == 0  # the 4 issued copies may still read their slots
    gpu.done()
    feed.retire()
    assert feed.pending == 0 and host.free() == 4


def test_a_consumer_on_a_side_stream_is_ordered_with_the_copies(gpu, feed):
    ops = feed.ops
    host = Host(gpu, feed)
    side = Stream(gpu, "side")
    with ops.use_stream(side):
        batches = list(feed.wrap(host.epoch(n=3)))
    assert len(batches) == 3
    assert {c for c in gpu.log if c[0] in ("wait_stream", "wait_event", "record_stream")} == {
        ("wait_stream", "copy", "side"), ("record_stream", "side"),
        *(("wait_event", "side", e) for e in (1, 3, 5)),
    }
    assert not any(c[0] == "wait_event" and c[1] == "default" for c in gpu.log)


def test_a_pageable_host_tensor_is_pinned_by_torch_before_its_non_blocking_copy(gpu, feed):
    host = Host(gpu, feed)
    for _ in feed.wrap(host.epoch(n=2, pageable=True)):  # labels outside the arena (an overflow)
        pass
    copies = [c for c in gpu.log if c[0] in ("pin", "copy")]
    assert copies == [("copy", "copy", True), ("pin",), ("copy", "copy", True)] * 2
    assert feed.staged == 2


@pytest.mark.parametrize("cuda_output", [True, False])
def test_only_the_cuda_feed_gets_page_locked_arena_memory(monkeypatch, cuda_output):
    """With ``pin_memory=True`` alone the user copies on streams gpufeed cannot see: the arena is
    not page-locked (batches are copied into torch's pinned memory instead)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    made = []
    context = EngineContext(EngineConfig(), Stats(), cuda_output=cuda_output,
                            make_registrar=lambda arena: made.append(arena) or object())
    arena = context.arena(warm_cap=2)
    assert (context.registrar is not None) == cuda_output and made == ([arena] if cuda_output else [])
    context.close()


def test_every_page_locking_call_runs_with_the_loaders_device_current(gpu):
    """A rank with device="cuda:1" that never called set_device: cudaHostRegister,
    cudaHostUnregister and torch's pinning must not run on device 0 (a context there per rank)."""
    feed = CudaFeed(torch.device("cpu"), prefetch_batches=2, stats=Stats(), ops=Ops(gpu, index=1))
    host = Host(gpu, feed)
    for _ in feed.wrap(host.epoch(n=3, pageable=True)):
        gpu.done()
    host.arena.close()
    calls = {call for call, _ in gpu.page_locks}
    assert calls == {"cudaHostRegister", "cudaHostUnregister", "pin"}
    assert [device for _, device in gpu.page_locks] == [1] * len(gpu.page_locks)
    assert gpu.current == [0]  # and nothing left current afterwards


MiB = 1 << 20


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def test_a_slot_is_page_locked_to_its_largest_batch_rounded_up_to_2_mib_and_counted_in_stats(gpu, feed):
    arena = Arena(96 * MiB, warm_cap=4)  # virtual: nothing here is written
    registrar = feed.registrar(arena, cudart=gpu)
    a, b = arena.acquire(), arena.acquire()
    largest = {a: 0, b: 0}
    for slot, extent in ((a, 38_500_000), (a, 30_000_000), (b, 3_000), (a, 40_000_000), (b, 5 * MiB)):
        registrar.ensure(slot, extent)
        largest[slot] = max(largest[slot], extent)
        ranges = {arena.slot_tensor(s).data_ptr(): s for s in (a, b)}
        for ptr, nbytes in gpu.ranges.items():
            assert largest[ranges[ptr]] <= nbytes <= _round_up(largest[ranges[ptr]], 2 * MiB)
        assert feed.stats.snapshot()["pinned_bytes"] == sum(gpu.ranges.values())
    assert sorted(gpu.ranges.values()) == [6 * MiB, 40 * MiB]  # not 64 MiB for a 38.5 MB batch
    arena.close()
    assert gpu.ranges == {} and feed.stats.snapshot()["pinned_bytes"] == 0


@pytest.mark.parametrize("how", ["idle trim", "surplus release"])
def test_trimming_unlocks_page_locked_slots_before_giving_their_pages_back(gpu, how):
    feed = CudaFeed(torch.device("cpu"), prefetch_batches=2, stats=Stats(), ops=Ops(gpu, index=1))
    arena = Arena(8 * MiB, warm_cap=1 if how == "surplus release" else 4)
    registrar = feed.registrar(arena, cudart=gpu)
    slots = [arena.acquire() for _ in range(3)]
    slot_at = {arena.slot_tensor(s).data_ptr(): s for s in slots}
    resident_at_unregister = []
    gpu.on_unregister = lambda ptr: resident_at_unregister.append(arena.resident_bytes(slot_at[ptr]))
    for slot in slots:
        arena.slot_tensor(slot)[: 3 * MiB].fill_(7)  # the batch the worker wrote
        registrar.ensure(slot, 3 * MiB)
    assert feed.stats.snapshot()["pinned_bytes"] == 3 * 4 * MiB
    for slot in slots:
        arena.release(slot)  # surplus release: the 2nd and 3rd find warm_cap ids waiting
    if how == "idle trim":
        arena.trim_waiting()
    trimmed = [s for s in slots if arena.resident_bytes(s) == 0]
    assert len(trimmed) == (3 if how == "idle trim" else 2)
    assert resident_at_unregister == [3 * MiB] * len(trimmed)  # unlocked while its pages were there
    assert len(gpu.ranges) == 3 - len(trimmed) and not arena.snapshot().pinned & set(trimmed)
    assert feed.stats.snapshot()["pinned_bytes"] == sum(gpu.ranges.values())
    assert {device for _, device in gpu.page_locks} == {1}
    reused = arena.acquire()  # a trimmed slot, written and page-locked again
    assert reused in trimmed
    registrar.ensure(reused, 3 * MiB)
    assert len(gpu.ranges) == 4 - len(trimmed) and reused in arena.snapshot().pinned
    arena.close()
    assert gpu.ranges == {} and feed.stats.snapshot()["pinned_bytes"] == 0


def test_hand_out_of_one_batch_copies_on_the_copy_stream_for_the_consumer_and_keeps_the_slot(gpu, feed):
    # ImageBatcher's hand-out: one tensor per batch, with the loader's stream discipline
    host = Host(gpu, feed)
    epoch = host.epoch(n=1)
    images, _labels = next(epoch)
    free_before = host.free()
    on_device = hand_out(feed, images)
    assert int(on_device[0, 0, 0, 0]) == 0
    assert [c for c in gpu.log if c[0] == "copy"] == [("copy", "copy", True)]
    assert [c for c in gpu.log if c[0] in ("wait_stream", "wait_event", "record_stream")] == [
        ("wait_stream", "copy", "default"), ("wait_event", "default", 1), ("record_stream", "default")]
    assert gpu.syncs() == []
    del images, _labels
    assert feed.pending == 1 and host.free() == free_before  # the copy may still read the slot
    gpu.done(upto=2)  # the copy's start and end events
    feed.retire()
    assert feed.pending == 0 and host.free() == free_before + 1
    epoch.close()


def _copies_by_consumer(log: list[tuple]) -> dict[str, list[int]]:
    """The copy stream's calls in issue order, cut where it waits on a consumer stream: consumer
    -> the end events of the copies issued after its wait (each checked to be one whole copy:
    start event, the copy, end event, with no other call on the copy stream in between)."""
    on_copy = [c for c in log if c[0] in ("copy", "record") or c[:2] == ("wait_stream", "copy")]
    by_consumer: dict[str, list[int]] = {}
    for k in range(0, len(on_copy), 4):
        wait, start, copy, end = on_copy[k:k + 4]
        assert wait[:2] == ("wait_stream", "copy") and start[:2] == end[:2] == ("record", "copy"), on_copy
        assert copy == ("copy", "copy", True) and end[2] == start[2] + 1, on_copy
        by_consumer.setdefault(wait[2], []).append(end[2])
    return by_consumer


def test_concurrent_batch_threads_share_one_copy_stream_each_copy_waiting_only_on_its_own_stream(gpu, feed):
    """ImageBatcher's model threads (max_concurrent_batches=2) hand out at the same time: the
    copy stream is made once, each thread runs its batch on its own stream, its copy waits on
    that stream alone, and its results are tied to it; nothing waits on the host."""
    gpu.stream_delay_s = 0.05  # both threads ask for the copy stream before it exists
    host = Host(gpu, feed)
    epoch = host.epoch(n=4)
    batches = [next(epoch)[0] for _ in range(4)]
    both_in = threading.Barrier(2)
    model_streams: dict[str, list[str]] = {}

    def model(x: torch.Tensor) -> torch.Tensor:
        model_streams.setdefault(threading.current_thread().name, []).append(feed.ops.current_stream().name)
        both_in.wait(timeout=10)  # the two batches are in their models at once
        return x[:, 0, 0, 0].float()

    runner = _Runner(model, driver=None, cuda=feed, decode_timeout_s=1.0, name="t")  # type: ignore[arg-type]
    out: dict[str, list[float]] = {}
    start = threading.Barrier(2)

    def serve(name: str, mine: list[torch.Tensor]) -> None:
        for images in mine:
            start.wait(timeout=10)
            out.setdefault(name, []).append(float(runner._model(images)[0]))

    threads = [threading.Thread(target=serve, args=(name, batches[k::2]), name=name)
               for k, name in enumerate(("A", "B"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert out == {"A": [0.0, 2.0], "B": [1.0, 3.0]}
    assert len(gpu.copy_streams) == 1  # the copy stream made once, shared
    assert model_streams == {"A": ["consumer-A"] * 2, "B": ["consumer-B"] * 2}
    ends = _copies_by_consumer(gpu.log)
    assert sorted(ends) == ["consumer-A", "consumer-B"] and all(len(e) == 2 for e in ends.values())
    for consumer, events in ends.items():
        waits = [c[2] for c in gpu.log if c[:2] == ("wait_event", consumer)]
        assert waits == events  # each thread's stream waits on its own copies' ends, no other
        # the copied batch, then the model's outputs for the default stream, tied to their streams
        assert [c for c in gpu.log if c[0] == "record_stream" and c[1] == consumer] == [("record_stream", consumer)] * 2
    assert not any(c[0] == "wait_event" and c[1] in ("default", "copy") for c in gpu.log)
    assert gpu.syncs() == []
    del batches
    gpu.done()
    feed.retire()
    assert feed.pending == 0
    epoch.close()


def test_a_batch_threads_outputs_are_ready_for_the_default_stream(gpu, feed):
    """A model that returns device tensors: the default stream (where a caller reading the
    futures' results works) waits on the batch thread's stream, and the outputs are tied to it."""
    host = Host(gpu, feed)
    epoch = host.epoch(n=1)
    images = next(epoch)[0]
    runner = _Runner(lambda x: [x[0], x[0]], driver=None, cuda=feed, decode_timeout_s=1.0,  # type: ignore[arg-type]
                     name="t")
    result = runner._model(images)
    me = f"consumer-{threading.current_thread().name}"
    assert len(result) == 2 and [c for c in gpu.log if c[0] == "record_stream"] == [
        ("record_stream", me), ("record_stream", "default"), ("record_stream", "default")]
    waits = [c for c in gpu.log if c[0] == "wait_stream"]
    assert waits == [("wait_stream", "copy", me), ("wait_stream", "default", me)]
    assert feed.ops.current_stream().name == "default" and gpu.syncs() == []
    del images
    epoch.close()


def test_the_no_wait_variant_issues_no_wait_on_the_consumer_stream(gpu):
    """A benchmark variant (benchmarks/cuda_feed.py): the copy stream never waits on the consumer;
    the rest of the ordering is the default's."""
    feed = CudaFeed(torch.device("cpu"), prefetch_batches=2, stats=Stats(), ops=Ops(gpu), wait_on_consumer=False)
    host = Host(gpu, feed)
    got = [int(images[0, 0, 0, 0]) for images, _ in feed.wrap(host.epoch())]
    assert got == list(range(N))
    assert not any(c[0] == "wait_stream" for c in gpu.log)
    assert [c[2] for c in gpu.log if c[0] == "wait_event"] == [2 * k + 1 for k in range(N)]
    assert [c for c in gpu.log if c[0] == "record_stream"] == [("record_stream", "default")] * (2 * N)
    assert gpu.syncs() == []


def test_the_keep_references_variant_holds_each_batch_until_an_event_after_its_use_completed(gpu):
    """A benchmark variant: no record_stream; the feed keeps each device batch until an event
    recorded on the consumer stream at the next hand-out (after the work queued on the batch)
    has completed."""
    feed = CudaFeed(torch.device("cpu"), prefetch_batches=2, stats=Stats(), ops=Ops(gpu), keep_references=True)
    host = Host(gpu, feed)
    it = feed.wrap(host.epoch())
    first = weakref.ref(next(it)[0])
    assert first() is not None  # the feed holds it: no event after its use yet
    next(it)
    uses = [c for c in gpu.log if c[0] == "record" and c[1] == "default"]
    assert len(uses) == 2  # one event on the consumer stream per hand-out
    assert first() is not None  # the event after batch 0's use has not completed
    gpu.done()
    next(it)
    assert first() is None  # dropped at the next poll once that event completed
    for _ in it:
        gpu.done()
    assert not any(c[0] == "record_stream" for c in gpu.log)
    assert [c for c in gpu.log if c[0] == "wait_stream"] == [("wait_stream", "copy", "default")] * N
    assert gpu.syncs() == []
    assert feed.held == 1  # the last batch: no hand-out after it yet


class ViewHost(Host):
    """Host batches of a ``MultiView``: a list of view tensors (two sizes) in one leased slot."""

    def _batch(self, k: int, pageable: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
        slot = self.arena.acquire()
        self.registrar.ensure(slot, 4096)
        view = torch.frombuffer(self.arena.lease(slot, 4096), dtype=torch.uint8)
        view.copy_(torch.arange(4096, dtype=torch.int64).mul_(k + 7).remainder_(251).to(torch.uint8))
        views = [view[:2 * 3 * 8 * 8].view(2, 3, 8, 8), view[512:512 + 2 * 3 * 4 * 4].view(2, 3, 4, 4),
                 view[1024:1024 + 2 * 3 * 4 * 4].view(2, 3, 4, 4)]
        labels = view[2048:2064].view(torch.int64)
        self.batches.append(weakref.ref(views[0]))
        return views, labels


def test_every_view_is_copied_from_page_locked_memory_and_normalized_as_on_the_cpu(gpu):
    """A MultiView batch on the GPU path: one copy per view (and the labels), on the copy stream,
    from the page-locked slot; each view normalized with the same constants and arithmetic as the
    workers' CPU path (``convert_``). Checked on the fake GPU only: it has not run on a GPU."""
    from gpufeed.cuda._transform import GpuTransform
    from gpufeed.image._normalize import affine, convert_, work_dtype

    normalize = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    transform = GpuTransform(torch.float32, normalize)
    feed = CudaFeed(torch.device("cpu"), prefetch_batches=2, gpu_transform=transform, stats=Stats(),
                    ops=Ops(gpu))
    host = ViewHost(gpu, feed)
    batches = 3
    seen = 0
    for k, (views, labels) in enumerate(feed.wrap(host.epoch(n=batches))):
        assert isinstance(views, list) and [tuple(v.shape) for v in views] == [(2, 3, 8, 8), (2, 3, 4, 4), (2, 3, 4, 4)]
        raw = torch.arange(4096, dtype=torch.int64).mul_(k + 7).remainder_(251).to(torch.uint8)
        for got, (start, shape) in zip(views, [(0, (2, 3, 8, 8)), (512, (2, 3, 4, 4)), (1024, (2, 3, 4, 4))]):
            rows = raw[start:start + math.prod(shape)].view(shape)
            want = convert_(torch.empty(shape), rows, affine(normalize, work_dtype(torch.float32)))
            assert got.dtype == torch.float32 and torch.equal(got, want)
        assert labels.dtype == torch.int64
        gpu.done()
        seen += 1
    assert seen == batches
    copies = [c for c in gpu.log if c[0] == "copy"]
    assert copies == [("copy", "copy", True)] * (4 * batches)  # 3 views + labels, page-locked
