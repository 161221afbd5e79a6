"""FastLoader: torch's DataLoader, same signature and semantics, on gpufeed's worker engine."""

from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from gpufeed._engine.arena import Arena
from gpufeed._engine.context import EngineContext, Registrar
from gpufeed._image.cv2threads import single_threaded_cv2
from gpufeed._image.feed import make_image_feed
from gpufeed.cache import CacheSize, parse_cache_bytes
from gpufeed.config import EngineConfig
from gpufeed.cuda import CudaFeed, resolve_device
from gpufeed.stats import Stats, worker_usage

T_co = TypeVar("T_co", covariant=True)


class FastLoader(DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader``.

    Takes exactly the installed DataLoader's arguments (same defaults, same validation, same
    ``len()``), followed by gpufeed's keyword-only options. ``num_workers=0`` is torch's own
    single-process path. With workers, batches come from gpufeed's engine: worker processes write
    tensor payloads into one shared memfd arena owned by the loader, and the batches you receive
    are views of it, valid for as long as you hold them.

    With a gpufeed image dataset (``ImageFolder``, ``ImageDataset``, ``LMDBDataset``) that has a
    transform, and the default ``collate_fn``, batches take the image fast path: workers decode,
    crop and resize straight into the batch, which arrives as ``(images, labels)``: images a
    ``[N, 3, H, W]`` tensor (uint8, or normalized floats), labels int64 ``[N]``.

    Other Parameters:
        max_worker_restarts: dead workers replaced per iterator before raising ``WorkerError``.
        max_batch_bytes: arena slot capacity in bytes (virtual; larger batches still work).
        shutdown_timeout_s: wait for workers to exit before terminating them, in seconds.
        channels_last: image path: NHWC memory for the ``[N, 3, H, W]`` images.
        normalize: image path: ``(mean, std)`` per RGB channel in torchvision's 0-1 scale; the
            batch becomes ``(x / 255 - mean) / std`` in ``dtype`` (float32 by default).
        dtype: image path: output dtype, ``torch.uint8`` (default without normalize), float32,
            float16 or bfloat16 (floats without normalize are ``x / 255``).
        on_error: image path: ``"raise"`` (default) an error naming the file and sample index, or
            ``"skip"``: leave undecodable samples out of their batch, count and log them.
        cache_bytes: image path: budget of the loader's LRU host cache, an int (bytes), a size
            like ``"2GB"``, or a share of available memory like ``"60%"``. None: no cache.
        seed: image path: seed of the random augmentations; default: the ``generator``'s
            initial seed (or torch's), so the same seed gives the same batches at any num_workers.
        device: ``"cuda"``, ``"cuda:N"`` or a ``torch.device``: batches arrive on that device,
            copied from the page-locked arena on the loader's own stream ahead of use; on the
            image path uint8 crosses PCIe and dtype/normalize/layout run on the GPU.
        prefetch_batches: with ``device``, how many batches are copied ahead (>= 1).
        pin_workers: pin worker k to one CPU (``os.sched_setaffinity``), round-robin.
        log_dir: each worker's logging also goes to ``LOG_DIR/worker-K.log``.
        metrics_port: serve this loader's ``gpufeed_*`` Prometheus metrics on that port
            (needs the ``metrics`` extra, prometheus-client).
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        *args: Any,
        max_worker_restarts: int = EngineConfig.max_worker_restarts,
        max_batch_bytes: int = EngineConfig.max_batch_bytes,
        shutdown_timeout_s: float = EngineConfig.shutdown_timeout_s,
        channels_last: bool = False,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
        on_error: str = "raise",
        cache_bytes: CacheSize = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        prefetch_batches: int = 2,
        pin_workers: bool = False,
        log_dir: str | os.PathLike | None = None,
        metrics_port: int | None = None,
        **kwargs: Any,
    ) -> None:
        # gpufeed's options are validated first: nothing is started before every check passed.
        config = EngineConfig(
            max_worker_restarts=max_worker_restarts,
            max_batch_bytes=max_batch_bytes,
            shutdown_timeout_s=shutdown_timeout_s,
        )
        cache_budget = parse_cache_bytes(cache_bytes)
        if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 1:
            raise ValueError(f"`prefetch_batches` must be an int >= 1. Found: {prefetch_batches!r}.")
        cuda_device = resolve_device(device)
        super().__init__(dataset, *args, **kwargs)
        stats = Stats()
        # The CUDA feed owns the copy stream; the arena's registrar drains it before unregistering.
        self._cuda_feed = None if cuda_device is None else CudaFeed(cuda_device, prefetch_batches, stats=stats)
        # What the engine needs for the loader's whole life (the arena too, once created); the
        # iterators read it there, never here.
        self._context = EngineContext(
            config,
            stats,
            cuda_output=cuda_device is not None,
            pin_workers=bool(pin_workers),
            log_dir=None if log_dir is None else os.fspath(log_dir),
            fork_guard=single_threaded_cv2,
            make_registrar=None if self._cuda_feed is None else self._cuda_feed.registrar,
        )
        weakref.finalize(self, self._context.close)  # the arena goes with the loader
        self._epoch = 0
        self._image_feed = make_image_feed(
            self,
            channels_last=channels_last,
            normalize=normalize,
            dtype=dtype,
            on_error=on_error,
            cache_budget=cache_budget,
            seed=seed,
            on_gpu=cuda_device is not None,
        )
        self._context.plugin = self._image_feed
        if self._cuda_feed is not None and self._image_feed is not None:
            self._cuda_feed.gpu_transform = self._image_feed.gpu_transform
        self.metrics_server = None
        if metrics_port is not None:
            from gpufeed.metrics import serve

            self.metrics_server = serve(metrics_port)
            self.metrics_server.register(self)

    # gpufeed's options that the engine reads live in its context: one place, read at iter().
    @property
    def engine_config(self) -> EngineConfig:
        return self._context.config

    @engine_config.setter
    def engine_config(self, value: EngineConfig) -> None:
        self._context.config = value

    @property
    def pin_workers(self) -> bool:
        return self._context.pin_workers

    @pin_workers.setter
    def pin_workers(self, value: bool) -> None:
        self._context.pin_workers = bool(value)

    @property
    def log_dir(self) -> str | None:
        return self._context.log_dir

    @log_dir.setter
    def log_dir(self, value: str | os.PathLike[str] | None) -> None:
        self._context.log_dir = None if value is None else os.fspath(value)

    @property
    def _arena(self) -> Arena | None:
        """The arena, if an iterator created it (for tests and tools)."""
        return self._context.current_arena

    @property
    def _registrar(self) -> Registrar | None:
        return self._context.registrar

    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes of every live iterator of this loader."""
        return self._context.worker_pids()

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch number the next ``iter()`` uses for random augmentations (then +1 each).

        Epochs are counted automatically; call this when resuming a run from a checkpoint.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"`epoch` must be an int >= 0. Found: {epoch!r}.")
        self._epoch = epoch

    def _begin_epoch(self) -> int:
        """The augmentation epoch of the iteration that starts now."""
        epoch = self._epoch
        self._epoch += 1
        return epoch

    def _get_iterator(self):
        epoch = self._epoch  # the augmentation epoch of this pass, used once the iterator exists
        iterator: _BaseDataLoaderIter
        if self.num_workers == 0:
            if self._image_feed is None:
                return super()._get_iterator()
            from gpufeed._image.local import LocalImageIter

            iterator = LocalImageIter(self, self._image_feed, self._context.stats, epoch)
        else:
            from gpufeed._engine.iterator import FastIter

            self.check_worker_number_rationality()
            iterator = FastIter(self, self._context, epoch)
        self._epoch = epoch + 1
        return iterator

    def __iter__(self):
        if self.persistent_workers and self.num_workers > 0 and self._iterator is not None:
            # torch's DataLoader.__iter__ would call ``self._iterator._reset(self)``; the new
            # pass's augmentation epoch goes with it.
            from gpufeed._engine.iterator import FastIter

            iterator = self._iterator
            assert isinstance(iterator, FastIter)
            iterator.next_epoch(self, self._begin_epoch())
        else:
            iterator = super().__iter__()
        if self._cuda_feed is None:
            return iterator
        return self._cuda_feed.wrap(iterator)

    def stats(self) -> dict[str, float | int]:
        """Counters since the loader was created.

        Always: batches, samples, batches_per_s, samples_per_s; per-stage worker seconds
        (fetch_s, read_s, decode_s, transform_s, collate_s, pack_s, h2d_s); wait_s and
        data_wait_fraction (time ``__next__`` blocked: the consumer's starvation); queue_depth
        (ready batches at the last ``__next__``) and queue_depth_mean; errors, worker_restarts,
        overflow_bytes; workers (per live worker: pid, cpu_s, rss_bytes). Image path: images,
        images_per_s, skipped, cache_hits, cache_misses, cache_bytes, cache_hit_rate.
        """
        out = self._context.stats.snapshot()
        out["workers"] = worker_usage(self.worker_pids())
        feed = self._image_feed
        if feed is not None:
            cache = feed.cache
            hits, misses = (cache.hits, cache.misses) if cache is not None else (0, 0)
            out.update(
                images=feed.images,
                skipped=feed.skipped,
                cache_hits=hits,
                cache_misses=misses,
                cache_bytes=cache.nbytes if cache is not None else 0,
                cache_hit_rate=hits / (hits + misses) if hits + misses else 0.0,
                images_per_s=feed.images / out["elapsed_s"] if out["elapsed_s"] > 0 else 0.0,
            )
        return out

    def close(self) -> None:
        """Stop persistent workers and release the arena now (idempotent).

        Batches you still hold stay valid; the loader can be iterated again afterwards.
        """
        iterator = self._iterator
        if iterator is not None and hasattr(iterator, "close"):
            iterator.close()
        self._iterator = None
        self._context.close()

    def __enter__(self) -> FastLoader[T_co]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check_worker_number_rationality(self) -> None:
        # torch calls this in __init__ (recent versions) and again on each iterator: warn once
        # per loader and worker count, not twice
        if getattr(self, "_workers_checked", None) != self.num_workers:
            self._workers_checked = self.num_workers
            super().check_worker_number_rationality()


def _signature() -> inspect.Signature:
    """The installed DataLoader's signature followed by gpufeed's keyword-only options."""
    torch_params = list(inspect.signature(DataLoader.__init__).parameters.values())
    ours = [
        p
        for name, p in inspect.signature(FastLoader.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return inspect.Signature(torch_params + ours)


FastLoader.__init__.__signature__ = _signature()  # type: ignore[attr-defined]
