"""ImageBatcher: encoded images in, decoded in gpufeed's workers, one model call per batch.

It composes a :class:`~gpufeed.serve.DynamicBatcher` (batch formation, deadlines,
cancellation, ``Overloaded``, failures, stats) with the worker engine the loader uses
(``gpufeed._engine``): each batch the batcher forms is one engine task, decoded by a worker
straight into an arena slot (the requests' bytes are written into that slot first, see
``gpufeed.serve._requests``), then handed to the model as a view of the slot.

Lifecycle: construction starts ``num_workers`` decode processes (``forkserver`` by default:
forking a threaded server is unsafe) and the batcher's threads; :meth:`ImageBatcher.close`
closes the batcher first (drain or cancel, as ``DynamicBatcher.close`` documents), then stops
the workers and releases the arena. A forgotten batcher is closed by its ``weakref.finalize``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from gpufeed._engine.context import EngineContext
from gpufeed._engine.engine import Engine
from gpufeed._engine.layout import align_up
from gpufeed._engine.messages import Done, Failed
from gpufeed._engine.worker import WorkerSpec
from gpufeed.config import EngineConfig
from gpufeed.cuda._feed import CudaFeed, check_device, hand_back, hand_out, resolve_device
from gpufeed.cuda._transform import GpuTransform
from gpufeed.errors import DecodeError, check_int, shorten
from gpufeed.image._cv2threads import single_threaded_cv2
from gpufeed.image._fill import FillReport, ImagePlan
from gpufeed.image._transforms import ImageTransform, ResizeCenterCrop
from gpufeed.serve._batcher import DynamicBatcher
from gpufeed.serve._clock import MAX_WAIT_S, Clock
from gpufeed.serve._config import BatcherConfig
from gpufeed.serve._requests import EngineDriver, RequestFeed, RequestSource
from gpufeed.stats import Stats

__all__ = ["ImageBatcher"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Item:
    """One request as the DynamicBatcher queues it: its number and its encoded bytes."""

    number: int
    data: bytes | bytearray | memoryview


@dataclass(frozen=True)
class _Validator:
    """Runs in ``submit``'s thread: an empty or too large request fails alone, at once."""

    max_request_bytes: int
    name: str

    def __call__(self, item: _Item) -> None:
        size = memoryview(item.data).nbytes
        if size == 0:
            raise DecodeError(f"request #{item.number} of ImageBatcher {self.name!r} is empty (0 bytes); "
                              "send JPEG, PNG or WebP bytes.")
        if size > self.max_request_bytes:
            raise ValueError(f"request #{item.number} of ImageBatcher {self.name!r} is {size} bytes, more than "
                             f"max_request_bytes={self.max_request_bytes}; raise it or send smaller images.")


class _Runner:
    """The batcher's ``fn``: decode a batch in a worker, run the model. Holds no reference to
    the ImageBatcher, so a forgotten one can be finalized."""

    def __init__(self, model: Callable[[torch.Tensor], Any], driver: EngineDriver, cuda: CudaFeed | None,
                 decode_timeout_s: float, name: str) -> None:
        self.model, self.driver, self.cuda = model, driver, cuda
        self.decode_timeout_s = decode_timeout_s
        self.name = name
        self.undecodable = 0  # requests failed by their bytes (one thread at a time adds: _lock)
        self._lock = threading.Lock()
        self._thread = threading.local()  # each model thread's CUDA stream, made at its first batch

    def __call__(self, items: list[_Item]) -> list[Any]:
        numbers = [item.number for item in items]
        record, reply = self.driver.run(numbers, [item.data for item in items], self.decode_timeout_s)
        engine = self.driver.engine
        if isinstance(reply, Failed):
            raise engine.failure(record, reply)
        assert isinstance(reply, Done), "an image task ends in Done or Failed"
        report: FillReport = reply.report
        results: list[Any] = [None] * len(items)
        bad = [pos for pos in range(len(items)) if pos not in set(report.kept)]
        if bad:
            with self._lock:
                self.undecodable += len(bad)
        for pos, (_, where, message) in zip(bad, report.errors):
            results[pos] = DecodeError(
                f"cannot decode {where} of ImageBatcher {self.name!r}: {message}. Send JPEG, PNG or WebP bytes.")
        images, _ = engine.result(record, reply)  # views of the slot, freed when they die
        if report.kept:
            try:
                out = self._rows(images, len(report.kept))
            except Exception as exc:
                if not bad:
                    raise  # the whole batch fails, with the batcher's note naming it
                # The undecodable requests keep their own DecodeError; the rest get the model's
                # (the batcher notes the batch and item on each).
                out = [exc] * len(report.kept)
            for row, pos in enumerate(report.kept):
                results[pos] = out[row]
        return results

    def _rows(self, images: torch.Tensor, expected: int) -> Any:
        """The model's results for the decoded images, one per image (checked)."""
        out = self._model(images)
        try:
            count = len(out)
        except TypeError:
            count = -1
        if count != expected:
            raise ValueError(
                f"the model returned {'an unsized ' + type(out).__name__ if count < 0 else count} "
                f"result(s) for a batch of {expected} images; it must return one per image, "
                "batch dimension first.")
        return out

    def _model(self, images: torch.Tensor) -> Any:
        feed = self.cuda
        if feed is None:
            with torch.inference_mode():
                return self.model(images)
        # Each model thread runs its batches on a stream of its own: on one shared stream (the
        # default) two batches would run one after the other on the GPU, and each copy would wait
        # on the other thread's model (docs/design/cuda-feed.md, "Concurrent batches").
        stream = getattr(self._thread, "stream", None)
        if stream is None:
            stream = self._thread.stream = feed.ops.new_consumer_stream()
        with feed.ops.use_stream(stream):
            on_device = hand_out(feed, images)  # the slot is page-locked (HostRegistrar)
            with torch.inference_mode():
                x = on_device if feed.gpu_transform is None else feed.gpu_transform.apply(on_device)
                out = self.model(x)
            hand_back(feed, out, stream)  # a caller may read device results on the default stream
        return out


def _check_arguments(model: Any, transform: Any, num_workers: Any, max_request_bytes: Any, decode_timeout_s: Any,
                     restart_window_s: Any, mp_context: Any) -> ImageTransform:
    """``ImageBatcher``'s own arguments, checked before any process starts; returns the transform
    (``ResizeCenterCrop(224, 256)`` for None)."""
    if not callable(model):
        raise TypeError(f"`model` must be callable (batch tensor -> outputs). Found: {shorten(model)}.")
    transform = ResizeCenterCrop(224, 256) if transform is None else transform
    if not isinstance(transform, ImageTransform):
        raise TypeError(f"`transform` must be a gpufeed image transform (e.g. ResizeCenterCrop). "
                        f"Found: {shorten(transform)}.")
    check_int("num_workers", num_workers, 1)
    check_int("max_request_bytes", max_request_bytes, 1)
    if not isinstance(decode_timeout_s, (int, float)) or not decode_timeout_s > 0:
        raise ValueError(f"`decode_timeout_s` must be a number > 0 (seconds). Found: {shorten(decode_timeout_s)}.")
    if restart_window_s is not None and (
            not isinstance(restart_window_s, (int, float)) or not restart_window_s > 0):
        raise ValueError(f"`restart_window_s` must be a number > 0 (seconds) or None. "
                         f"Found: {shorten(restart_window_s)}.")
    if mp_context not in multiprocessing.get_all_start_methods():
        raise ValueError(f"`mp_context` must be one of {multiprocessing.get_all_start_methods()}. "
                         f"Found: {shorten(mp_context)}.")
    return transform


class ImageBatcher:
    """Serves an image model from encoded bytes (JPEG, PNG, WebP), decoded in worker processes.

    Each batch the :class:`~gpufeed.serve.DynamicBatcher` rule forms (full, or its oldest
    request waited ``max_delay_ms``) is decoded by one of ``num_workers`` gpufeed worker
    processes into a shared-memory slot (``transform``, then ``dtype``/``normalize`` exactly as
    ``FastLoader`` does them), and ``model`` is called once on the collated batch (N, 3, H, W)
    under ``torch.inference_mode()``. With a CUDA ``device`` the uint8 batch is copied from
    page-locked memory without blocking and converted and normalized on the GPU.

    A request that does not decode fails alone with :class:`~gpufeed.errors.DecodeError` naming
    it (``request #N``); the rest of its batch is served. A dead worker is replaced and its batch
    decoded again, once: if that kills a worker too, the batch's requests fail with
    :class:`~gpufeed.errors.WorkerError`. Once ``max_worker_restarts`` replacements happened
    within ``restart_window_s`` (a crash loop), every request fails with ``WorkerError``.
    Deadlines, cancellation, backpressure (:class:`~gpufeed.serve.Overloaded`), ``stats()`` and
    ``close()`` are the DynamicBatcher's.

    Args:
        model: called with the batch tensor; returns one result per image, batch dimension first
            (the i-th request gets ``output[i]``).
        transform: a gpufeed image transform with a fixed output size.
        normalize: ``((mean_r, mean_g, mean_b), (std_r, std_g, std_b))`` in the 0-1 scale, as
            FastLoader's; None: no normalization.
        dtype: of the batch; default float32 with ``normalize``, else uint8.
        device: None / "cpu", or a CUDA device the batch is copied to. Construction calls no CUDA
            runtime function (the workers start then); plain ``"cuda"`` is the constructing
            thread's current device when CUDA is already initialised there, else device 0 (the
            current device of the model thread running the first batch). With
            ``max_concurrent_batches`` > 1 each model thread runs its batches on a CUDA stream of its
            own; device results are made ready for the default stream.
        num_workers: decode processes.
        max_batch_size: as :class:`~gpufeed.serve.BatcherConfig`, like the next four.
        max_delay_ms: see :class:`~gpufeed.serve.BatcherConfig`.
        max_queue: see :class:`~gpufeed.serve.BatcherConfig`.
        max_concurrent_batches: see :class:`~gpufeed.serve.BatcherConfig`; the default 2 lets
            one batch decode while another runs the model.
        max_latency_ms: see :class:`~gpufeed.serve.BatcherConfig` (latency-aware admission;
            the batches' run times include their decode).
        preferred_batch_sizes: see :class:`~gpufeed.serve.BatcherConfig`.
        default_timeout_s: see :class:`~gpufeed.serve.BatcherConfig`.
        close_timeout_s: see :class:`~gpufeed.serve.BatcherConfig`.
        max_request_bytes: largest encoded request accepted; a larger one fails at ``submit``
            with ``ValueError``. Sizes the arena slots (virtual memory: pages are used only when written).
        decode_timeout_s: longest wait for a batch's decode (seconds) before its requests fail
            with ``TimeoutError``; deaths are noticed and handled meanwhile.
        max_worker_restarts: dead workers replaced within ``restart_window_s`` before the
            batcher gives up (a crash loop).
        restart_window_s: the window of ``max_worker_restarts`` (seconds); None counts over the
            batcher's whole life. Occasional deaths over a long-running service never add up.
        mp_context: start method of the workers ("forkserver", "spawn" or "fork").
        name: the batcher's name in messages, thread names and metrics.
        clock: time source of the batch rule and deadlines (tests inject a ManualClock).

    Attributes:
        batcher: the underlying :class:`~gpufeed.serve.DynamicBatcher`.

    Every argument is also an attribute of the same name.
    """

    def __init__(
        self,
        model: Callable[[torch.Tensor], Any],
        *,
        transform: ImageTransform | None = None,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        num_workers: int = 2,
        max_batch_size: int = 32,
        max_delay_ms: float = 5.0,
        max_queue: int = 256,
        max_concurrent_batches: int = 2,
        max_latency_ms: float | None = None,
        preferred_batch_sizes: Sequence[int] = (),
        default_timeout_s: float | None = None,
        close_timeout_s: float = 30.0,
        max_request_bytes: int = 8 << 20,
        decode_timeout_s: float = 60.0,
        max_worker_restarts: int = 16,
        restart_window_s: float | None = 60.0,
        mp_context: str = "forkserver",
        name: str = "images",
        clock: Clock | None = None,
    ) -> None:
        transform = _check_arguments(model, transform, num_workers, max_request_bytes, decode_timeout_s,
                                     restart_window_s, mp_context)
        # The batch options, checked before any process starts (the DynamicBatcher checks them again).
        config = BatcherConfig(
            max_batch_size=max_batch_size, max_delay_ms=max_delay_ms, max_queue=max_queue,
            max_concurrent_batches=max_concurrent_batches, max_latency_ms=max_latency_ms,
            preferred_batch_sizes=tuple(preferred_batch_sizes),
            default_timeout_s=default_timeout_s, close_timeout_s=close_timeout_s, name=name,
        )
        self.max_batch_size = config.max_batch_size
        self.max_delay_ms = config.max_delay_ms
        self.max_queue = config.max_queue
        self.max_concurrent_batches = config.max_concurrent_batches
        self.max_latency_ms = config.max_latency_ms
        self.preferred_batch_sizes = config.preferred_batch_sizes
        self.default_timeout_s = config.default_timeout_s
        self.close_timeout_s = config.close_timeout_s
        self.clock = clock
        self.model = model
        self.transform = transform
        self.normalize = normalize
        self.device = device
        self.num_workers = num_workers
        self.max_request_bytes = max_request_bytes
        self.decode_timeout_s = float(decode_timeout_s)
        self.max_worker_restarts = max_worker_restarts
        self.restart_window_s = restart_window_s
        self.mp_context = mp_context
        # No CUDA runtime call here: the workers start below, and a CUDA context made before them
        # would be inherited by forked ones. Plain "cuda" is the current device of this thread when
        # CUDA is already initialised (torch.cuda.set_device initialises it), else the feed
        # resolves it at the first batch, in a model thread (whose current device is 0).
        self._device = check_device(device)
        if self._device is not None and self._device.index is None and torch.cuda.is_initialized():
            self._device = resolve_device(self._device)
        on_gpu = self._device is not None and self._device.type == "cuda"
        if normalize is not None:
            mean, std = normalize
            normalize = (tuple(float(m) for m in mean), tuple(float(s) for s in std))
        self.dtype = dtype if dtype is not None else (torch.float32 if normalize is not None else torch.uint8)
        cuda = None
        if on_gpu and self._device is not None:
            cuda = CudaFeed(self._device, prefetch_batches=1, gpu_transform=GpuTransform(self.dtype, normalize))
        plan = ImagePlan(transform=transform, on_error="skip", normalize=None if on_gpu else normalize,
                         dtype=torch.uint8 if on_gpu else self.dtype)
        feed = RequestFeed(plan)
        slot_bytes = max(1 << 16, feed.staging_bytes([max_request_bytes] * max_batch_size))
        context = EngineContext(
            EngineConfig(max_batch_bytes=align_up(slot_bytes), max_worker_restarts=max_worker_restarts),
            Stats(), plugin=feed, cuda_output=on_gpu, fork_guard=single_threaded_cv2,
            make_registrar=None if cuda is None else cuda.registrar,
        )
        engine = Engine(context, WorkerSpec(dataset=RequestSource()), num_workers,
                        mp_context=multiprocessing.get_context(mp_context),
                        tasks_in_flight=max_concurrent_batches, max_task_retries=1,
                        restart_window_s=restart_window_s)
        self._engine, self._context = engine, context
        try:
            self._runner = runner = _Runner(model, EngineDriver(engine), cuda, self.decode_timeout_s, name)
            self.batcher = DynamicBatcher(
                runner, max_batch_size=max_batch_size, max_delay_ms=max_delay_ms, max_queue=max_queue,
                max_concurrent_batches=max_concurrent_batches, max_latency_ms=max_latency_ms,
                preferred_batch_sizes=preferred_batch_sizes,
                validate=_Validator(max_request_bytes, name), default_timeout_s=default_timeout_s,
                close_timeout_s=close_timeout_s, name=name, clock=clock,
            )
        except BaseException:
            engine.close()
            context.close()
            raise
        self._numbers = iter(range(1 << 62))  # next() is atomic under the GIL
        self._finalizer = weakref.finalize(self, _close, self.batcher, runner.driver, context, True, None)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, data: bytes | bytearray | memoryview, *, timeout_s: float | None = None) -> Future:
        """Queue one encoded image; return a ``concurrent.futures.Future`` of ``model(batch)[i]``.

        Any thread. ``timeout_s``: the request's deadline (see ``DynamicBatcher.submit``).
        An empty or too large request fails its future (``DecodeError`` / ``ValueError``); a
        request that does not decode fails with ``DecodeError`` once its batch is decoded.

        Raises:
            Overloaded: ``max_queue`` requests are already waiting, or (with ``max_latency_ms``)
                this one's predicted latency exceeds it.
            BatcherClosedError: ``close()`` was called.
            TypeError: ``data`` is not bytes-like.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"ImageBatcher.submit takes the encoded image as bytes. Found: {shorten(data)}.")
        return self.batcher.submit(_Item(next(self._numbers), data), timeout_s=timeout_s)

    async def infer(self, data: bytes | bytearray | memoryview, *, timeout_s: float | None = None) -> Any:
        """``await`` the model's output for one encoded image (see :meth:`submit`)."""
        return await asyncio.wrap_future(self.submit(data, timeout_s=timeout_s))

    # -- state ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The DynamicBatcher's ``stats()`` plus ``decoded`` (images), ``undecodable`` (requests
        failed by their bytes) and ``worker_restarts``."""
        out = self.batcher.stats()
        out["decoded"] = self._context.stats.samples
        out["undecodable"] = self._runner.undecodable
        out["worker_restarts"] = self._engine.restarts
        return out

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the live decode workers."""
        return self._engine.pids

    @property
    def name(self) -> str:
        return self.batcher.name

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Close the batcher (``drain``/``timeout_s`` as ``DynamicBatcher.close``), then stop the
        workers and release the arena (idempotent)."""
        if not self._finalizer.alive:
            return
        self._finalizer.detach()
        _close(self.batcher, self._runner.driver, self._context, drain, timeout_s)

    def __enter__(self) -> ImageBatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        b = self.batcher
        return (f"ImageBatcher({b.name!r}, {'closed' if self.closed else 'serving'}, num_workers={self.num_workers}, "
                f"max_batch_size={b.max_batch_size}, max_delay_ms={b.max_delay_ms}, max_queue={b.max_queue})")


def _close(batcher: DynamicBatcher, driver: EngineDriver, context: EngineContext, drain: bool,
           timeout_s: float | None) -> None:
    """Batches first (they use the workers), then the workers, then the arena."""
    try:
        batcher.close(drain=drain, timeout_s=timeout_s)
    finally:
        try:
            driver.close(MAX_WAIT_S)
        finally:
            context.close()
