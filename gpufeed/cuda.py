"""The CUDA feed: page-locked arena, one copy stream per loader, batches prefetched to the GPU.

Lifecycle (docs/design/cuda-feed.md has the whole story):

* ``HostRegistrar`` page-locks arena slots with ``cudaHostRegister`` the first time a batch of a
  given extent lands in them (growing by doubling, so each slot is registered a handful of times
  per loader, never per batch), and unregisters everything before the arena unmaps.
* ``CudaFeed`` owns the loader's copy stream for the loader's whole life (a stream per epoch
  would strand the caching allocator's per-stream pools). For every host batch it makes the copy
  stream wait on the consumer's stream (memory the consumer freed may still have queued reads),
  issues ``non_blocking`` copies, and records an event. The host batch, and with it the arena
  slot, is kept until that event has completed: a slot is never rewritten under a running copy.
* At hand-out the consumer stream (the current stream at ``__next__`` time) waits on the event;
  uint8 images are converted, laid out and normalized *on the consumer stream*, and every device
  tensor allocated on the copy stream is ``record_stream``-ed on the consumer stream, so it stays
  valid for as long as the user holds it.
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpufeed._image.normalize import Normalize, affine, check_image_output, to_float_
from gpufeed.errors import BackendUnavailableError

log = logging.getLogger(__name__)
_REGISTER_GRAIN_BYTES = 2 << 20


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The CUDA device ``device`` names, or None; raises at construction when CUDA is missing."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"`device` must be 'cuda', 'cuda:N' or a torch.device. Found: {device!r}.") from exc
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"`device` must be a CUDA device (or 'cpu'). Found: {device!r}.")
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"device={device!r} needs CUDA, which this process does not have: torch {torch.__version__} "
            f"(built with CUDA {torch.version.cuda}), torch.cuda.is_available() is False. Fix: install a "
            "CUDA build of torch on a machine with an NVIDIA GPU, or leave `device` unset and move "
            "batches yourself (pin_memory=True)."
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s).")
    return torch.device("cuda", index)


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
    """Page-locks arena slots with cudaHostRegister, once per slot extent; unregisters all at close."""

    def __init__(self, arena: Any) -> None:
        self._arena = arena
        self._cudart = torch.cuda.cudart()
        self._registered: dict[int, tuple[int, int]] = {}  # slot -> (address, bytes)
        arena.add_close_hook(self.close)

    def ensure(self, slot: int, nbytes: int) -> None:
        """Make the first ``nbytes`` of ``slot`` page-locked (a no-op when they already are)."""
        have = self._registered.get(slot)
        if have is not None and have[1] >= nbytes:
            return
        want = _REGISTER_GRAIN_BYTES
        while want < nbytes or (have is not None and want <= have[1]):
            want *= 2
        want = min(want, self._arena.slot_bytes)
        ptr = self._arena.slot_tensor(slot).data_ptr()
        if have is not None:
            self._cudart.cudaHostUnregister(have[0])
        err = self._cudart.cudaHostRegister(ptr, want, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {want} bytes of arena slot {slot} failed with error {int(err)}")
        self._registered[slot] = (ptr, want)
        self._arena.mark_pinned(slot)

    def close(self) -> None:
        for ptr, _ in self._registered.values():
            self._cudart.cudaHostUnregister(ptr)
        self._registered.clear()


def current_stream_event() -> torch.cuda.Event:
    """An event recorded on this thread's current CUDA stream: the copy guard of a loader with
    ``pin_memory=True`` (see ``Arena.set_copy_guard``). A batch freed right after
    ``.to("cuda", non_blocking=True)`` on that stream keeps its slot until the copy ran, as
    torch's pinned-memory allocator keeps its blocks."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream())
    return event


@dataclass(frozen=True)
class GpuTransform:
    """What the consumer stream does to image batches after the copy: dtype, layout, normalize
    (the arithmetic of the CPU path: ``gpufeed._image.normalize``)."""

    dtype: torch.dtype = torch.uint8
    normalize: Normalize | None = None
    channels_last: bool = False
    # device -> (scale, shift) of self.dtype: built once per device, since torch.tensor(...,
    # device=cuda) is a host-to-device copy that blocks the host, too slow for every batch
    _constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_image_output(self.dtype, self.normalize)

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` (uint8 NCHW, any memory format) in ``dtype``, normalized; uint8 unchanged."""
        if self.dtype == torch.uint8:
            return images
        return to_float_(images.to(self.dtype), self.constants(images.device))

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(scale, shift) on ``device`` for ``normalize``, the same tensors at every call; None
        without ``normalize``."""
        if self.normalize is None:
            return None
        found = self._constants.get(device)
        if found is None:
            found = self._constants[device] = affine(self.normalize, self.dtype, device)
        if device.type == "cuda":  # kept across batches: used on whichever stream is current
            stream = torch.cuda.current_stream(device)
            for t in found:
                t.record_stream(stream)
        return found


class CudaFeed:
    """Per-loader CUDA state: the device, the copy stream, the registrar, the GPU transform."""

    def __init__(
        self, device: torch.device, prefetch_batches: int, gpu_transform: GpuTransform | None, stats: Any = None
    ) -> None:
        self.device = device
        self.stats = stats  # h2d_s is added here
        self.prefetch_batches = prefetch_batches
        self.gpu_transform = gpu_transform
        self._stream: torch.cuda.Stream | None = None

    @property
    def stream(self) -> torch.cuda.Stream:
        """The loader's one copy stream, created on first use."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    def wrap(self, host_iter: Iterator[Any]) -> CudaIter:
        return CudaIter(self, host_iter)


class CudaIter:
    """Iterates device batches, ``prefetch_batches`` copies ahead of the consumer."""

    def __init__(self, feed: CudaFeed, host_iter: Iterator[Any]) -> None:
        self._feed = feed
        self._host = host_iter
        self._queue: collections.deque[tuple[Any, Any, torch.cuda.Event, torch.cuda.Event]] = collections.deque()
        self._retiring: collections.deque[tuple[Any, torch.cuda.Event, torch.cuda.Event]] = collections.deque()
        self._done = False
        # Dropped mid-epoch (``break``): the host batches die with the queues, freeing their slots
        # to workers; copies still reading them must finish first.
        weakref.finalize(self, _wait_for_copies, self._queue, self._retiring).atexit = False

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
        feed = self._feed
        copy_stream = feed.stream
        # Memory the consumer freed may be handed to this copy; its queued reads must finish first.
        copy_stream.wait_stream(torch.cuda.current_stream(feed.device))
        with torch.cuda.stream(copy_stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(copy_stream)
            dev = map_tensors(host, lambda t: t.to(feed.device, non_blocking=True))
            event = torch.cuda.Event(enable_timing=True)
            event.record(copy_stream)
        self._queue.append((host, dev, start, event))

    def _retire(self) -> None:
        """Drop host batches whose copies completed: only then may their arena slots be reused."""
        while self._retiring and self._retiring[0][2].query():
            _, start, end = self._retiring.popleft()
            if self._feed.stats is not None:
                self._feed.stats.h2d_s += start.elapsed_time(end) / 1000.0

    def __next__(self) -> Any:
        while not self._done and len(self._queue) < max(1, self._feed.prefetch_batches):
            self._issue()
        if not self._queue:
            for _, _, event in self._retiring:  # release the last slots only after their copies
                event.synchronize()
            self._retire()
            raise StopIteration
        host, dev, start, event = self._queue.popleft()
        consumer = torch.cuda.current_stream(self._feed.device)
        consumer.wait_event(event)
        dev = map_tensors(dev, lambda t: _owned_by(t, consumer))
        self._retiring.append((host, start, event))
        self._retire()
        transform = self._feed.gpu_transform
        if transform is not None:
            dev = (transform.apply(dev[0]), dev[1])
        if not self._done:
            self._issue()  # keep the pipeline full while the consumer computes
        return dev


def _wait_for_copies(*queues: collections.deque) -> None:
    """Block until the copy of every host batch in ``queues`` completed, then drop them."""
    for queue in queues:
        for entry in queue:
            entry[-1].synchronize()  # the end-of-copy event is each entry's last item
        queue.clear()


def _owned_by(t: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    t.record_stream(stream)  # allocated on the copy stream, used on the consumer's
    return t
