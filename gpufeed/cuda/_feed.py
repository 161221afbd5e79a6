"""The CUDA feed: page-locked arena, one copy stream per loader, batches prefetched to the GPU.

Lifecycle (docs/design/cuda-feed.md has the whole story):

* ``HostRegistrar`` page-locks arena slots with ``cudaHostRegister`` to the largest batch extent
  written there, rounded up to 2 MiB (for batches of one size: once per slot, never per batch).
  A slot the arena trims (surplus or idle warm slots give their pages back) is unregistered
  first. At arena close it first drains the copy stream (``CudaFeed.drain``), then unregisters
  everything, before the arena unmaps.
* ``CudaFeed`` owns the loader's copy stream for the loader's whole life (a stream per epoch
  would strand the caching allocator's per-stream pools). For every host batch it makes the copy
  stream wait on the consumer's stream (memory the consumer freed may still have queued reads),
  issues ``non_blocking`` copies from page-locked memory only, and records an event. The host
  batch, and with it the arena slot, is kept until that event has completed: a slot is never
  rewritten under a running copy. Nothing waits for that on the host, not even at the end of an
  epoch: completed copies are found by polling (``event.query()``).
* At hand-out the consumer stream (the current stream at ``__next__`` time) waits on the event;
  uint8 images are converted, laid out and normalized *on the consumer stream*, and every device
  tensor allocated on the copy stream is ``record_stream``-ed on the consumer stream, so it stays
  valid for as long as the user holds it. (The wait on the consumer stream and ``record_stream``
  are the defaults; ``CudaFeed`` has two private variants for benchmarks/cuda_feed.py to measure
  against them, docs/design/cuda-feed.md, "Guarding device memory".)

Page-locked arena memory is handed out only to this feed, which issues every copy from it on a
stream it knows. With ``pin_memory=True`` and no ``device`` the user issues the copies, on
streams gpufeed cannot see, so batches are copied into torch's pinned memory as DataLoader does
(``gpufeed._engine.iterator``), whose allocator records each copy's stream.

What has run: none of this module has run on a real GPU yet. The tests without a GPU run the
real feed, registrar and arena against a fake device that records every CUDA call
(``tests/unit/test_cuda_feed_cpu.py``: the order of the calls, slots, held batches);
``tests/gpu`` checks what only a GPU can show and skips without CUDA (docs/gpu-feed.md, "What
has run on a GPU").
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from gpufeed.errors import BackendUnavailableError, shorten

log = logging.getLogger(__name__)
REGISTER_GRAIN_BYTES = 2 << 20  # registrations are whole multiples of this


def visible_device_count() -> int:
    """CUDA devices this process may use, counted without initialising CUDA where NVML can.

    ``torch.cuda.device_count()`` asks NVML (honouring ``CUDA_VISIBLE_DEVICES``) until CUDA is
    initialised, and falls back to ``cudaGetDeviceCount`` only where NVML is missing or fails;
    ``torch.cuda.is_available()`` would call ``cudaGetDeviceCount`` (``cuInit``) every time, and
    a process that forks workers afterwards has them inherit a CUDA driver they cannot use.
    """
    return int(torch.cuda.device_count())


def check_device(device: str | torch.device | None) -> torch.device | None:
    """The CUDA device ``device`` names, index None for plain ``"cuda"``; None for no device.

    Runs at construction: it calls no CUDA runtime function (no context, no lazy init, nothing
    that poisons a later fork); a machine without CUDA, or an index past the devices NVML counts,
    fails here with the fix.
    """
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"`device` must be 'cuda', 'cuda:N' or a torch.device. Found: {shorten(device)}.") from exc
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"`device` must be a CUDA device (or 'cpu'). Found: {shorten(device)}.")
    count = visible_device_count()
    if count == 0:
        raise BackendUnavailableError(
            f"device={device!r} needs CUDA, which this process does not have: torch {torch.__version__} "
            f"(built with CUDA {torch.version.cuda}) sees no CUDA device (torch.cuda.device_count() is 0). "
            "Fix: install a CUDA build of torch on a machine with an NVIDIA GPU (and check "
            "CUDA_VISIBLE_DEVICES), or leave `device` unset and move batches yourself (pin_memory=True)."
        )
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device={device!r}: this machine has {count} CUDA device(s).")
    return dev


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``check_device``, then plain ``"cuda"`` becomes the current device: for the process that
    iterates, at its first iteration (``torch.cuda.current_device()`` initialises CUDA)."""
    dev = check_device(device)
    if dev is None or dev.index is not None:
        return dev
    return torch.device("cuda", torch.cuda.current_device())


def map_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in a nested batch (dicts, namedtuples, tuples, lists)."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        mapped = {k: map_tensors(v, fn) for k, v in data.items()}
        try:
            return type(data)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(v, fn) for v in data))
    if isinstance(data, tuple):
        return tuple(map_tensors(v, fn) for v in data)
    if isinstance(data, Sequence):
        mapped_list = [map_tensors(v, fn) for v in data]
        try:
            return type(data)(mapped_list)  # type: ignore[call-arg]
        except TypeError:
            return mapped_list
    return data


class HostRegistrar:
    """Page-locks arena slots with cudaHostRegister, to the largest batch extent written there.

    A slot is registered over the largest extent a batch used in it, rounded up to
    ``REGISTER_GRAIN_BYTES`` (2 MiB, so that extents a few bytes apart share one registration),
    and registered again only when a larger batch lands there: for batches of one size, once per
    slot. ``pinned_bytes`` (``stats.pinned_bytes``, ``FastLoader.stats()``) counts what is
    page-locked now. When the arena gives a slot's pages back (``Arena`` trims surplus or idle
    warm slots), it first calls ``unpin``: the range is unregistered, then the pages go.

    ``drain`` (the CUDA feed's ``CudaFeed.drain``) runs at close before the first
    ``cudaHostUnregister``: a copy still queued on the copy stream must never read memory that is
    no longer page-locked. A slot the arena trims is free, and a slot is freed only after the
    copies reading it completed (``CudaFeed``), so ``unpin`` waits for nothing.
    ``cudart`` defaults to ``torch.cuda.cudart()``, fetched at the first call (it initialises
    CUDA; tests pass a recorder).
    Every cudart call runs inside ``use_device()`` (the loader's device made current,
    ``CudaOps.use_device``): a rank given ``device="cuda:3"`` that never called
    ``torch.cuda.set_device`` would otherwise make a context on device 0, one per rank.
    ``ensure`` runs on the consumer thread, ``unpin`` in whatever thread frees a slot: a lock
    keeps the books.
    """

    def __init__(
        self,
        arena: Any,
        drain: Callable[[], None] | None = None,
        cudart: Any = None,
        use_device: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        stats: Any = None,
    ) -> None:
        self._arena = arena
        self._drain = drain
        self._use_device = use_device
        self._stats = stats  # pinned_bytes is kept here
        self._given_cudart = cudart  # torch.cuda.cudart() initialises CUDA: fetched at first use
        self._registered: dict[int, tuple[int, int]] = {}  # slot -> (address, bytes)
        self._lock = threading.Lock()
        arena.add_close_hook(self.close)
        arena.add_unpin_hook(self.unpin)

    @property
    def _cudart(self) -> Any:
        if self._given_cudart is None:
            self._given_cudart = torch.cuda.cudart()
        return self._given_cudart

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the arena page-locked now."""
        with self._lock:
            return sum(nbytes for _, nbytes in self._registered.values())

    def _count(self, delta: int) -> None:
        if self._stats is not None:
            self._stats.pinned_bytes += delta

    def ensure(self, slot: int, nbytes: int) -> None:
        """Make the first ``nbytes`` of ``slot`` page-locked (a no-op when they already are).

        Growing a registration unregisters the smaller one first: the slot was free until now,
        so no copy reads it (the feed keeps a host batch until its copy completed).
        """
        want = min(-(-nbytes // REGISTER_GRAIN_BYTES) * REGISTER_GRAIN_BYTES, self._arena.slot_bytes)
        with self._lock:
            have = self._registered.get(slot)
            if have is not None and have[1] >= want:
                return
            ptr = self._arena.slot_tensor(slot).data_ptr()
            with self._use_device():
                if have is not None:
                    del self._registered[slot]
                    self._count(-have[1])
                    self._cudart.cudaHostUnregister(have[0])
                err = self._cudart.cudaHostRegister(ptr, want, 0)
            if int(err) != 0:
                raise RuntimeError(
                    f"cudaHostRegister of {want} bytes of arena slot {slot} failed with error {int(err)}"
                )
            self._registered[slot] = (ptr, want)
            self._count(want)
        self._arena.mark_pinned(slot)

    def unpin(self, slot: int) -> None:
        """Unregister ``slot`` (the arena is about to give its pages back; a no-op if not locked)."""
        with self._lock:
            have = self._registered.pop(slot, None)
            if have is None:
                return
            with self._use_device():
                self._cudart.cudaHostUnregister(have[0])
            self._count(-have[1])

    def close(self) -> None:
        """Drain the copies, then unregister every range (the arena's close hook; idempotent)."""
        if self._drain is not None:
            self._drain()
        with self._lock:
            if self._registered:  # nothing registered: no CUDA call (a batcher closed unused)
                with self._use_device():
                    for ptr, _ in self._registered.values():
                        self._cudart.cudaHostUnregister(ptr)
            self._count(-sum(nbytes for _, nbytes in self._registered.values()))
            self._registered.clear()


class DeviceTransform(Protocol):
    """What the consumer stream does to a batch's tensors after the copy (the image path's
    ``gpufeed.cuda._transform.GpuTransform``: dtype, layout, normalize, a batch op)."""

    def apply(self, images: torch.Tensor) -> torch.Tensor: ...

    def apply_batch(self, batch: Any) -> Any: ...


class CudaOps:
    """Every CUDA call the feed makes, in one place, for one device.

    None of them is meant to block the host (``tests/gpu`` checks the steady state under
    ``torch.cuda.set_sync_debug_mode("error")``; it has not yet run on a GPU); the only host wait
    of the feed is ``stream.synchronize()`` in ``CudaFeed.drain``, at arena close. Tests without a
    GPU pass a stand-in with the same methods that records the calls
    (``tests/unit/test_cuda_feed_cpu.py``); events and streams are used through
    their torch methods: ``record``, ``query``, ``elapsed_time``, ``wait_stream``, ``wait_event``,
    ``synchronize``.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def new_consumer_stream(self) -> Any:
        """A stream a server's batch thread runs its batches on (``ImageBatcher``), made once
        per thread."""
        return torch.cuda.Stream(device=self.device)

    def default_stream(self) -> Any:
        return torch.cuda.default_stream(self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def use_device(self) -> AbstractContextManager[Any]:
        """The loader's device made current (page-locking and pinning run on the current one)."""
        return torch.cuda.device(self.device)

    def new_event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)  # creating and recording one never blocks

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.is_pinned()  # cudaPointerGetAttributes: sees cudaHostRegister'ed arena ranges

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory()  # torch's caching host allocator: it guards the block itself

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)


class CudaFeed:
    """Per-loader CUDA state: the device, the copy stream, the host batches whose copies may still
    run, the GPU transform.

    Every copy runs on the one copy stream, so its events complete in the order they were
    recorded: one FIFO of host batches for the loader (whatever iterator issued them) is retired
    by polling its head (``retire``), with no host wait. A host batch is dropped (its arena slot
    freed to the workers) only after its copy's end event completed; the iterator never waits for
    that, not even at the end of an epoch or when it is dropped mid-epoch: the batches stay here
    until a later ``__next__`` finds them done, or until ``drain`` (at arena close) waits.

    Threads: ``copy``, ``retire`` and ``drain`` may run in several threads at once (the model
    threads of ``ImageBatcher``, a finalizer). One lock guards the shared state: the copy
    stream's creation (once), the FIFO, ``staged`` and the stats; and a copy is issued whole under
    it (the wait on the consumer stream, the events, the copies, its place in the FIFO), so the
    FIFO's order is the copy stream's order and each copy is preceded by its own consumer's wait.
    """

    def __init__(
        self,
        device: torch.device,
        prefetch_batches: int,
        gpu_transform: DeviceTransform | None = None,
        stats: Any = None,
        ops: Any = None,
        *,
        wait_on_consumer: bool = True,
        keep_references: bool = False,
    ) -> None:
        self.device = device  # plain "cuda" (no index) is resolved at first use (``ops``)
        # Two guards against the copy stream reusing device memory the consumer still reads; the
        # defaults use both. The other settings are variants for benchmarks/cuda_feed.py to
        # measure (docs/design/cuda-feed.md, "Guarding device memory"), not user options:
        # wait_on_consumer=False: no wait of the copy stream on the consumer stream before a copy;
        # keep_references=True: no record_stream; the feed keeps each device batch until an event
        # recorded on its consumer stream at that stream's next hand-out has completed.
        self.wait_on_consumer = wait_on_consumer
        self.keep_references = keep_references
        self._held: list[list[Any]] = []  # keep_references: [device batch, consumer stream, event or None]
        self.stats = stats  # h2d_s is added here, pinned_bytes by the registrar
        self.prefetch_batches = prefetch_batches
        self.gpu_transform = gpu_transform
        self._ops = ops
        self.staged = 0  # pageable host tensors copied through torch's pinned memory (overflow)
        self._stream: Any = None
        self._pending: collections.deque[tuple[Any, Any, Any]] = collections.deque()  # (host, start, end)
        self._lock = threading.Lock()  # ``drain`` may run in a finalizer, in another thread

    @property
    def ops(self) -> Any:
        """The CUDA calls, for the feed's device: made at first use, where a plain ``"cuda"``
        becomes the current device of the thread using it (``resolve_device``); a feed built
        at construction (``ImageBatcher``) so calls no CUDA runtime function until its first batch."""
        if self._ops is None:
            with self._lock:
                if self._ops is None:
                    device = resolve_device(self.device)
                    assert device is not None, "a CudaFeed has a CUDA device"
                    self.device, self._ops = device, CudaOps(device)
        return self._ops

    @property
    def stream(self) -> Any:
        """The loader's one copy stream, created on first use (once, whatever the threads)."""
        self.ops  # noqa: B018 - made before the lock is taken (``ops`` takes it)
        with self._lock:
            return self._copy_stream()

    def _copy_stream(self) -> Any:
        """``stream``, with the lock held."""
        if self._stream is None:
            self._stream = self.ops.new_stream()
        return self._stream

    @property
    def pending(self) -> int:
        """Host batches held because their copy may not have completed."""
        return len(self._pending)

    @property
    def held(self) -> int:
        """Device batches the feed keeps (``keep_references`` only) until their use completed."""
        return len(self._held)

    def registrar(self, arena: Any, cudart: Any = None) -> HostRegistrar:
        """The arena's registrar, draining this feed's copies before it unregisters."""
        return HostRegistrar(arena, drain=self.drain, cudart=cudart, use_device=lambda: self.ops.use_device(),
                             stats=self.stats)

    def wrap(self, host_iter: Iterator[Any]) -> CudaIter:
        return CudaIter(self, host_iter)

    def copy(self, host: Any) -> tuple[Any, Any]:
        """Issue the copy of a host batch on the copy stream; (device batch, end event).

        The copy stream first waits for the work queued on the current stream: a device block the
        consumer freed may be handed to this copy while its kernels still read it.
        """
        ops = self.ops
        consumer = ops.current_stream()
        with self._lock:
            stream = self._copy_stream()
            if self.wait_on_consumer:
                stream.wait_stream(consumer)
            with ops.use_device(), ops.use_stream(stream):  # the device: for torch's pinning (``pin``)
                start = ops.new_event()
                start.record(stream)
                dev = map_tensors(host, self._to_device)
                end = ops.new_event()
                end.record(stream)
            self._pending.append((host, start, end))
        return dev, end

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        # A non_blocking copy from pageable memory is staged by the driver behind the stream's
        # queued work, a hidden host wait. Arena views are page-locked (HostRegistrar); a payload
        # that overflowed its slot is not, and goes through torch's pinned memory instead (with
        # the lock held: an overflow is rare, and the order of the copy stream stays whole).
        if not self.ops.is_pinned(t):
            t = self.ops.pin(t)
            self.staged += 1
        return self.ops.to_device(t)

    def hand_to(self, dev: Any, consumer: Any) -> Any:
        """``dev`` (allocated on the copy stream) made safe to use on ``consumer``: each tensor
        ``record_stream``-ed on it; or, with ``keep_references``, kept by the feed until an event
        recorded on ``consumer`` at its next hand-out (after the work queued on ``dev``) completed."""
        ops = self.ops
        if not self.keep_references:
            return map_tensors(dev, lambda t: _owned_by(ops, t, consumer))
        used = ops.new_event()
        used.record(consumer)  # after everything queued on consumer so far: the earlier batches' use
        with self._lock:
            for entry in self._held:
                if entry[1] is consumer and entry[2] is None:
                    entry[2] = used
            self._held.append([dev, consumer, None])
        return dev

    def retire(self) -> None:
        """Drop the host batches whose copies completed (their slots go back to the workers), and
        (``keep_references``) the device batches whose use completed."""
        done: list[Any] = []
        with self._lock:
            while self._pending and self._pending[0][2].query():
                done.append(self._pending.popleft())
            if self.stats is not None:
                for _, start, end in done:
                    self.stats.h2d_s += start.elapsed_time(end) / 1000.0
            if self._held:
                used = [e for e in self._held if e[2] is not None and e[2].query()]
                self._held = [e for e in self._held if not any(e is u for u in used)]
                done.extend(used)
        del done  # the host (and kept device) batches die here, outside the lock

    def drain(self) -> None:
        """Wait for every copy issued on the copy stream, then drop their host batches. Runs
        before the arena unregisters its memory (``HostRegistrar.close``): the one host wait."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.synchronize()
        with self._lock:
            done, self._pending = self._pending, collections.deque()
        del done


class CudaIter:
    """Iterates device batches, ``prefetch_batches`` copies ahead of the consumer."""

    def __init__(self, feed: CudaFeed, host_iter: Iterator[Any]) -> None:
        self._feed = feed
        self._host = host_iter
        self._queue: collections.deque[tuple[Any, Any]] = collections.deque()  # (device batch, end event)
        self._done = False
        self.on_yield: Any = None  # counts the batches handed to the user (the loader's position)

    def __iter__(self) -> CudaIter:
        return self

    def __len__(self) -> int:
        return len(self._host)  # type: ignore[arg-type]

    def _issue(self) -> None:
        """Start the copy of the next host batch (sets ``_done`` at the end of the epoch)."""
        try:
            host = next(self._host)
        except StopIteration:
            self._done = True
            return
        self._queue.append(self._feed.copy(host))

    def __next__(self) -> Any:
        feed = self._feed
        while not self._done and len(self._queue) < max(1, feed.prefetch_batches):
            self._issue()
        feed.retire()
        if not self._queue:
            raise StopIteration  # copies still running keep their host batches in the feed
        dev, end = self._queue.popleft()
        consumer = feed.ops.current_stream()
        consumer.wait_event(end)
        dev = feed.hand_to(dev, consumer)
        transform = feed.gpu_transform
        if transform is not None:
            dev = transform.apply_batch(dev)
        if not self._done:
            self._issue()  # keep the pipeline full while the consumer computes
        if self.on_yield is not None:
            self.on_yield.yielded += 1
        return dev


def _owned_by(ops: Any, t: torch.Tensor, stream: Any) -> torch.Tensor:
    ops.record_stream(t, stream)  # allocated on the copy stream, used on the consumer's
    return t


def hand_out(feed: CudaFeed, host: torch.Tensor) -> torch.Tensor:
    """One host batch on the device, ready for the current (consumer) stream: the copy runs on
    the feed's copy stream without blocking the host, the consumer stream waits for it, and the
    result is tied to the consumer stream (``ImageBatcher``'s hand-out; ``CudaIter`` does the
    same for a loader's batches). The feed keeps the host batch, so its slot, until the copy has
    completed."""
    feed.retire()
    on_device, copied = feed.copy(host)
    consumer = feed.ops.current_stream()
    consumer.wait_event(copied)
    return feed.hand_to(on_device, consumer)


def hand_back(feed: CudaFeed, results: Any, stream: Any) -> None:
    """A batch's results, computed on ``stream`` (a server's batch thread), made ready for the
    device's default stream, with no host wait: the default stream waits on ``stream``, and each
    device tensor in ``results`` is tied to the default stream (its memory is not reused before
    the work queued there when it is freed has run)."""
    ops = feed.ops
    default = ops.default_stream()
    default.wait_stream(stream)
    map_tensors(results, lambda t: _owned_by(ops, t, default) if t.device == ops.device else t)
