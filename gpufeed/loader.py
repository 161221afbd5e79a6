"""FastLoader: torch's DataLoader, same signature and semantics, on gpufeed's worker engine."""

from __future__ import annotations

import inspect
import os
import sys
import warnings
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from gpufeed._engine.arena import Arena
from gpufeed._engine.context import EngineContext, Registrar
from gpufeed._engine.iterator import FastIter
from gpufeed._engine.ranks import check_local_ranks
from gpufeed._fastpath.explain import explain_dataset, explain_loader
from gpufeed._fastpath.feed import ImageFeed, fast_path_blocker, make_image_feed
from gpufeed._fastpath.local import LocalImageIter, LocalSampleIter
from gpufeed._fastpath.samples import SampleFeed, make_sample_feed
from gpufeed._fastpath.subsets import fast_dataset
from gpufeed._options import check_options, serve_metrics
from gpufeed._rebuilds import warn_rebuilt_by_accelerate
from gpufeed._resume.loader import ResumableLoader, ResumeState
from gpufeed.cache import CacheSize, parse_cache_bytes
from gpufeed.config import EngineConfig
from gpufeed.cuda._feed import CudaFeed, resolve_device
from gpufeed.errors import GpufeedWarning, check_int
from gpufeed.image import explain_transform
from gpufeed.image._cv2threads import fast_path_fork_guard, single_threaded_cv2
from gpufeed.sources import ImageSource
from gpufeed.sources._detection import DetectionSource
from gpufeed.stats import Stats, worker_usage

T_co = TypeVar("T_co", covariant=True)


class FastLoader(ResumableLoader, DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader``.

    Takes exactly the installed DataLoader's arguments (same defaults, same validation, same
    ``len()``), followed by gpufeed's keyword-only options. ``num_workers=0`` is torch's own
    single-process path. With workers, batches come from gpufeed's engine: worker processes write
    tensor payloads into one shared memfd arena owned by the loader, and the batches you receive
    are views of it, valid for as long as you hold them.

    With a gpufeed image dataset (``ImageFolder``, ``ImageDataset``, ``LMDBDataset``) that has a
    transform, and the default ``collate_fn``, batches take the image fast path: workers decode,
    crop and resize straight into the batch, which arrives as ``(images, labels)``: images a
    ``[N, 3, H, W]`` tensor (uint8, or normalized floats), labels int64 ``[N]``. With a
    detection dataset (``DetectionSource``) whose ``transforms`` gpufeed translated, its
    per-sample form: images of any size, any ``collate_fn``, run in the workers
    (``seed``/``on_error`` apply; the batch options do not: the pipeline sets the output).

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
            ``"skip"``: leave out of their batch, count and log the samples that do not decode
            or whose file cannot be read (gone, a directory, no permission; a remote read that
            failed for good). Other read errors (I/O errors) are raised either way.
        cache_bytes: image path: budget of the host cache, an int (bytes), a size like
            ``"2GB"``, or a share of available memory like ``"60%"``. None: no cache. Over a
            detection dataset it keeps each sample's encoded bytes and record. A uint8
            batch whose every row is cached (deterministic transform) is made by the main
            process, one thread, when it is handed out: no worker starts for it. With a cache
            shared by the ranks of a job (``cache_scope``), it is the job's budget on the host,
            resolved once for the host by the first loader that creates the cache.
        cache_scope: image path: ``"auto"`` (default): one cache shared by every loader of
            the job on this host when the process is one of several local ranks (torchrun,
            Lightning DDP, Accelerate, ``mp.spawn`` with torch.distributed, or
            ``GPUFEED_CACHE_JOB`` set), else the loader's own LRU; ``"host"``: always the
            shared one (a job must be found); ``"rank"``: the loader's own LRU, a copy per
            rank. docs/design/host-cache.md.
        seed: image path: seed of the random augmentations; default: the ``generator``'s
            initial seed (or torch's), so the same seed gives the same batches at any num_workers.
        device: ``"cuda"``, ``"cuda:N"`` or a ``torch.device``: batches arrive on that device,
            copied from the page-locked arena on the loader's own stream ahead of use; on the
            image path uint8 crosses PCIe and dtype/normalize/layout run on the GPU.
            Construction calls no CUDA runtime function: the devices are counted through NVML
            (``torch.cuda.device_count()``; ``cudaGetDeviceCount`` only where NVML is missing),
            and ``"cuda"`` becomes the current device at the first ``iter()``.
        prefetch_batches: with ``device``, how many batches are copied ahead (>= 1).
        pin_workers: pin worker k to one CPU (``os.sched_setaffinity``), round-robin over this
            rank's share of the host: the local ranks that share CPUs split them, so no CPU
            holds two ranks' workers while another idles (the training guide, "Many ranks on
            one host"). The main process is never pinned.
        local_ranks: ``(local rank, number of local ranks)`` on this host, for launchers that
            set neither ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` nor a process group; None (default):
            found from those.
        log_dir: each worker's logging also goes to ``LOG_DIR/worker-K.log``.
        metrics_port: serve this loader's ``gpufeed_*`` Prometheus metrics on port
            ``metrics_port + LOCAL_RANK`` (the environment variable torchrun and Lightning set, 0
            when unset), so the ranks of one host serve side by side; a port already in use is a
            warning, not an error. Needs the ``metrics`` extra (prometheus-client).
        batch_transform: image path: MixUp/CutMix over each batch, in the workers: torchvision
            v2's ``MixUp``, ``CutMix``, ``RandomChoice`` of them, or timm's ``Mixup``
            (``mode="batch"``); targets become float32 ``[N, num_classes]``, parameters depend on
            (seed, epoch, batch number) only. Anything else is a ``TypeError``
            (docs/augmentations.md, "MixUp and CutMix").

    Every option is a plain attribute under its parameter name holding the value given (so a
    framework that rebuilds a loader from its attributes, as Lightning does to inject a
    ``DistributedSampler``, gets an equivalent one); setting one afterwards raises ``ValueError``,
    as DataLoader does for its own. Options are validated at construction; the values that depend
    on the process (``device="cuda"``: its current device; a ``"60%"`` cache budget; the default
    ``seed``) are resolved at the first ``iter()``, in the process that iterates, where the
    engine's state (context, image and CUDA feeds) is built. ``replace(**overrides)`` makes a
    loader with the same arguments except those given; a loader pickles to its arguments
    (unpickled, it is a fresh loader: ``mp.spawn`` and ``ddp_spawn`` work). ``set_epoch(epoch)``
    sets the augmentation epoch and calls ``set_epoch`` of the sampler (``DistributedSampler``).

    ``state_dict()`` / ``load_state_dict(state)`` resume mid-epoch with the protocol of torchdata's
    ``StatefulDataLoader``: the state (a small versioned JSON-serialisable dict) is the position of
    the batches received so far, computed, never replayed; a loaded state applies to the next
    ``iter()``, which yields exactly the rest of that epoch (byte-identical on the image path and
    for deterministic datasets, with any ``num_workers``; with ``gpufeed.DistributedSampler``, on
    any world size). Supported: map-style datasets with a ``SequentialSampler``, ``RandomSampler``,
    ``WeightedRandomSampler``, ``SubsetRandomSampler``, torch's ``DistributedSampler`` (the one
    Lightning injects; rank 0's state resumes every rank)
    or ``gpufeed.DistributedSampler`` (alone or in a ``BatchSampler``), or a sampler or
    ``batch_sampler`` of yours (the rule is in ``state_dict()``), ``in_order`` either way
    (with ``in_order=False`` the state also lists the batches delivered out of order); an
    ``IterableDataset`` with its own ``state_dict``/``load_state_dict`` (with workers, each
    worker's copy's state, for the same ``num_workers``). Datasets that draw from the workers'
    random generators resume exactly with the same ``num_workers``.
    ``state_dict()`` raises ``NotImplementedError`` otherwise.
    A state taken after a pass's last batch carries the next pass's order (the sampler's epoch or
    generator), set at ``load_state_dict()``: frameworks may ``iter()`` before ``set_epoch()``.
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
        cache_scope: str = "auto",
        seed: int | None = None,
        device: str | torch.device | None = None,
        prefetch_batches: int = 2,
        pin_workers: bool = False,
        local_ranks: tuple[int, int] | None = None,
        log_dir: str | os.PathLike | None = None,
        metrics_port: int | None = None,
        batch_transform: Any = None,
        **kwargs: Any,
    ) -> None:
        # gpufeed's options are validated first: nothing is started before every check passed.
        self._engine_config = EngineConfig(
            max_worker_restarts=max_worker_restarts,
            max_batch_bytes=max_batch_bytes,
            shutdown_timeout_s=shutdown_timeout_s,
        )
        check_options(cache_bytes=cache_bytes, cache_scope=cache_scope, prefetch_batches=prefetch_batches,
                      metrics_port=metrics_port, device=device, local_ranks=local_ranks)
        # Every option is an attribute under its parameter name, holding the value given (decision
        # 14): frameworks rebuild loaders from them. Set before DataLoader's own __init__ so that
        # a rebuild reading them can never see a half-made loader.
        self.max_worker_restarts = max_worker_restarts
        self.max_batch_bytes = max_batch_bytes
        self.shutdown_timeout_s = shutdown_timeout_s
        self.channels_last = channels_last
        self.normalize = normalize
        self.dtype = dtype
        self.on_error = on_error
        self.cache_bytes = cache_bytes
        self.cache_scope = cache_scope
        self.seed = seed
        self.device = device
        self.prefetch_batches = prefetch_batches
        self.pin_workers = pin_workers
        self.local_ranks = local_ranks
        self.log_dir = log_dir
        self.metrics_port = metrics_port
        self.batch_transform = batch_transform
        super().__init__(dataset, *args, **kwargs)
        # The image options are checked against the loader's path (a dry run of the feed, with the
        # values as given; the feed iteration uses is made again in the process that iterates).
        self._image_path = self._make_image_feed(on_gpu=False, dry_run=True) is not None
        self._stats = Stats()
        self._context: EngineContext | None = None  # made at the first iter() of this process
        self._context_pid = 0
        self._cuda_feed: CudaFeed | None = None
        self._image_feed: ImageFeed | SampleFeed | None = None
        self._epoch = 0
        self._sampler_epochs: dict[int, Any] = {}  # id(sampler) -> its epoch at its last pass
        self._warned_epoch = False
        self._resume_state = ResumeState()  # what was loaded, the latest pass (gpufeed._resume.loader)
        self.metrics_server = None
        if metrics_port is not None:
            self.metrics_server = serve_metrics(metrics_port)
            if self.metrics_server is not None:
                self.metrics_server.register(self)
        self.__options_frozen = True

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr in _OPTIONS and self.__dict__.get("_FastLoader__options_frozen", False):
            raise ValueError(
                f"{attr} attribute should not be set after {type(self).__name__} is initialized; "
                f"use loader.replace({attr}=...) for a loader with another value"
            )
        super().__setattr__(attr, value)

    @property
    def engine_config(self) -> EngineConfig:
        """The engine's options (``max_worker_restarts``, ``max_batch_bytes``, ``shutdown_timeout_s``)."""
        return self._engine_config

    # -- rebuilding -------------------------------------------------------------------------------

    def _init_kwargs(self) -> dict[str, Any]:
        """The constructor arguments that make an equivalent loader, read from the attributes."""
        kwargs: dict[str, Any] = {"dataset": self.dataset}
        for name in _TORCH_PARAMS:
            if name in ("dataset", "shuffle", "sampler", "batch_sampler", "batch_size", "drop_last"):
                continue
            if hasattr(self, name):
                kwargs[name] = getattr(self, name)
        iterable = isinstance(self.dataset, IterableDataset)
        if self.batch_size is None and self.batch_sampler is not None:  # a batch_sampler was given
            kwargs["batch_sampler"] = self.batch_sampler
        else:
            kwargs.update(batch_size=self.batch_size, drop_last=self.drop_last)
            if not iterable:
                kwargs["sampler"] = self.sampler
        kwargs.update({name: getattr(self, name) for name in _OPTIONS})
        return kwargs

    def replace(self, **overrides: Any) -> FastLoader[T_co]:
        """A new loader with this one's arguments, except ``overrides`` (any constructor argument).

        Samplers are shared with this loader, as a framework rebuilding it would share them.
        """
        return type(self)(**self._replace_kwargs(overrides))

    def _replace_kwargs(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The constructor arguments of ``replace(**overrides)``."""
        kwargs = self._init_kwargs()
        if "shuffle" in overrides or "sampler" in overrides or "batch_sampler" in overrides:
            kwargs.pop("sampler", None)
        if "batch_sampler" in overrides:
            kwargs.pop("batch_size", None)
            kwargs.pop("drop_last", None)
        elif "batch_size" in overrides or "drop_last" in overrides:
            kwargs.pop("batch_sampler", None)
        unknown = sorted(set(overrides) - set(_TORCH_PARAMS) - _OPTIONS)
        if unknown:
            raise TypeError(f"replace() takes FastLoader's arguments. Found unknown: {unknown}.")
        if overrides.get("num_workers", 1) == 0 and "prefetch_factor" not in overrides:
            kwargs["prefetch_factor"] = None  # torch refuses one without workers
        kwargs.update(overrides)
        return kwargs

    def __reduce__(self) -> tuple[Any, ...]:
        # A loader pickles to its arguments, never its live state (workers, arena, streams).
        kwargs = self._init_kwargs()
        context = kwargs.get("multiprocessing_context")
        if context is not None and hasattr(context, "get_start_method"):
            kwargs["multiprocessing_context"] = context.get_start_method()
        return (_rebuild, (type(self), kwargs))

    @property
    def multiprocessing_context(self) -> Any:
        # Accelerate's prepare_data_loader / skip_first_batches read the loader's attributes to
        # build a plain torch DataLoader: say so (once) instead of losing the engine silently.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("accelerate.") and not self.__dict__.get("_rebuild_expected", False):
            warn_rebuilt_by_accelerate(self)
        return DataLoader.multiprocessing_context.fget(self)  # type: ignore[attr-defined]

    @multiprocessing_context.setter
    def multiprocessing_context(self, value: Any) -> None:
        DataLoader.multiprocessing_context.fset(self, value)  # type: ignore[attr-defined]

    # -- the state of the process that iterates -----------------------------------------------------

    def _make_image_feed(self, on_gpu: bool, dry_run: bool = False) -> ImageFeed | SampleFeed | None:
        """The image feed (over a ``DetectionSource``: the per-sample one), or None for the
        generic path, whose reason it keeps for ``stats()`` and ``explain(loader)``; ``dry_run``:
        the check at construction (it warns of the generic path once, and attaches to no host
        cache)."""
        self._path_reason: str | None = fast_path_blocker(self)
        make = make_sample_feed if isinstance(fast_dataset(self.dataset), DetectionSource) else make_image_feed
        return make(
            self,
            channels_last=self.channels_last,
            normalize=self.normalize,
            dtype=self.dtype,
            on_error=self.on_error,
            cache_budget=parse_cache_bytes(self.cache_bytes),
            cache_scope=self.cache_scope,
            cache_text=str(self.cache_bytes),
            dry_run=dry_run,
            seed=self.seed,
            on_gpu=on_gpu,
            announce=dry_run,
            batch_transform=self.batch_transform,
        )

    def _engine_context(self) -> EngineContext:
        """This process's engine context, made (and the options resolved) on first use here."""
        context = self._context
        if context is not None and self._context_pid == os.getpid():
            return context
        # Resolved here, in the process that iterates: the CUDA device (``"cuda"``: this process's
        # current device), the cache budget (``"60%"`` of this machine's available memory), the
        # default seed. A forked copy of a loader makes its own (the arena is its parent's).
        cuda_device = resolve_device(self.device)
        self._cuda_feed = (
            None if cuda_device is None else CudaFeed(cuda_device, self.prefetch_batches, stats=self._stats)
        )
        self._image_feed = self._make_image_feed(on_gpu=cuda_device is not None)
        if self._cuda_feed is not None and self._image_feed is not None:
            self._cuda_feed.gpu_transform = self._image_feed.gpu_transform
        context = EngineContext(
            self._engine_config,
            self._stats,
            plugin=self._image_feed,
            cuda_output=cuda_device is not None,
            pin_workers=bool(self.pin_workers),
            local_ranks=check_local_ranks(self.local_ranks),
            log_dir=None if self.log_dir is None else os.fspath(self.log_dir),
            fork_guard=single_threaded_cv2 if self._image_feed is None else fast_path_fork_guard,
            make_registrar=None if self._cuda_feed is None else self._cuda_feed.registrar,
        )
        weakref.finalize(self, context.close)  # the arena goes with the loader
        self._context, self._context_pid = context, os.getpid()
        return context

    @property
    def _arena(self) -> Arena | None:
        """The arena, if an iterator created it (for tests and tools)."""
        context = self._context
        return context.current_arena if context is not None and self._context_pid == os.getpid() else None

    @property
    def _registrar(self) -> Registrar | None:
        context = self._context
        return context.registrar if context is not None and self._context_pid == os.getpid() else None

    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes of every live iterator of this loader."""
        context = self._context
        return context.worker_pids() if context is not None and self._context_pid == os.getpid() else []

    # -- epochs ---------------------------------------------------------------------------------

    def _epoch_samplers(self) -> list[Any]:
        """The samplers with ``set_epoch`` (``sampler``, ``batch_sampler.sampler``), once each."""
        found: list[Any] = []
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if callable(getattr(sampler, "set_epoch", None)) and all(s is not sampler for s in found):
                found.append(sampler)
        return found

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: of the random augmentations of the next ``iter()`` (then +1 each), and
        of the samplers that have ``set_epoch`` (``DistributedSampler``), as
        ``sampler.set_epoch(epoch)`` would.

        Augmentation epochs are counted automatically; sampler epochs are not (as with
        DataLoader): call this before each epoch, as with a ``DistributedSampler``.
        """
        check_int("epoch", epoch, 0)
        self._epoch = epoch
        for sampler in self._epoch_samplers():
            sampler.set_epoch(epoch)

    def _check_sampler_epochs(self) -> None:
        """Warn once when a shuffling sampler with ``set_epoch`` starts a pass at the epoch of its
        last pass: it would give the same order again (its epoch is not advanced for you)."""
        for sampler in self._epoch_samplers():
            if not getattr(sampler, "shuffle", True):
                continue
            epoch = getattr(sampler, "epoch", None)
            key = id(sampler)
            if key in self._sampler_epochs and self._sampler_epochs[key] == epoch and not self._warned_epoch:
                self._warned_epoch = True
                warnings.warn(
                    f"the {type(sampler).__name__} of this loader starts a pass at epoch {epoch!r} again, so "
                    "it gives the same order as the last pass. Call loader.set_epoch(epoch) (or "
                    "sampler.set_epoch(epoch)) before each epoch.",
                    GpufeedWarning,
                    stacklevel=3,
                )
            self._sampler_epochs[key] = epoch

    def _begin_epoch(self) -> int:
        """The augmentation epoch of the iteration that starts now."""
        epoch = self._epoch
        self._epoch += 1
        return epoch

    def _get_iterator(self):
        context = self._engine_context()
        epoch = self._epoch  # the augmentation epoch of this pass, used once the iterator exists
        iterator: _BaseDataLoaderIter
        if self.num_workers == 0:
            if self._image_feed is None:
                iterator = super()._get_iterator()
                self._mark_pass(epoch)
                return iterator
            feed = self._image_feed
            iterator = (LocalSampleIter(self, feed, context.stats, epoch) if isinstance(feed, SampleFeed)
                        else LocalImageIter(self, feed, context.stats, epoch))
        else:
            self.check_worker_number_rationality()
            iterator = FastIter(self, context, epoch, self._take_resume_workers())
        self._epoch = epoch + 1
        self._mark_pass(epoch)
        return iterator

    def __iter__(self):
        self._engine_context()
        self._check_sampler_epochs()
        if self.persistent_workers and self.num_workers > 0 and self._iterator is not None:
            # torch's DataLoader.__iter__ would call ``self._iterator._reset(self)``; the new
            # pass's augmentation epoch goes with it.
            iterator = self._iterator
            assert isinstance(iterator, FastIter)
            epoch = self._begin_epoch()
            iterator.next_epoch(self, epoch, self._take_resume_workers())
            self._mark_pass(epoch)
        else:
            iterator = super().__iter__()
        user_iter: Any = iterator
        if self._cuda_feed is not None:
            user_iter = self._cuda_feed.wrap(iterator)
        p = self._track_pass(iterator, isinstance(iterator, FastIter))
        if p is not None:
            # What the user received is counted where it is handed out: with workers or a CUDA
            # feed, batches are pulled from the index stream ahead of the user.
            p.count_pulls = self.num_workers == 0 and self._cuda_feed is None
            if not p.count_pulls:
                user_iter.on_yield = p
            if isinstance(iterator, FastIter) and not self.in_order and not isinstance(self.dataset, IterableDataset):
                p.delivery = []  # batches go out as they complete: record which ones did
                iterator.order_log = p.delivery
        self._resume_state.user_iter = weakref.ref(user_iter)
        return user_iter

    def stats(self) -> dict[str, Any]:
        """Counters since the loader was created.

        Always: path ("image": the image fast path, over a ``DetectionSource`` its per-sample form
        with any collate_fn; "generic": per-sample ``__getitem__`` + collate) and path_reason
        (why the generic path, and the fix; None on the image path), as ``gpufeed.explain(loader)``
        says them; batches, samples, batches_per_s,
        samples_per_s; per-stage worker seconds (fetch_s, read_s, decode_s, transform_s,
        collate_s, pack_s, h2d_s); wait_s and
        data_wait_fraction (time ``__next__`` blocked: the consumer's starvation); queue_depth
        (ready batches at the last ``__next__``) and queue_depth_mean; errors, worker_restarts,
        overflow_bytes; pinned_bytes (arena bytes page-locked now for ``device=``: each slot to
        its largest batch rounded up to 2 MiB, given back when slots are trimmed; 0 without
        CUDA); workers (per live worker: pid, cpu_s, rss_bytes). Image path: images,
        images_per_s, skipped, cache_hits, cache_misses (this loader's look-ups), cache_bytes
        (bytes the cache holds: with a shared cache, the host's, the same on every rank),
        cache_budget_bytes (its budget: the host's), cache_shared (1: the job's host cache),
        cache_hit_rate;
        parent_batches and parent_s (batches the main process made itself because every row was
        a cache hit, and its seconds on them, not in the worker stage seconds); reads and
        read_latency_s (the workers' reads of the source and their summed duration, each timed
        on the thread that read: storage latency, while read_s is the decoding thread's wait);
        read_concurrency_max (the most reads in flight a worker allowed for a batch: with the
        dataset's ``read_concurrency=None``, what the workers chose; 1: one at a time).
        """
        out = self._stats.snapshot()
        out["path"] = "generic" if self._path_reason is not None else "image"
        out["path_reason"] = self._path_reason
        out["workers"] = worker_usage(self.worker_pids())
        feed = self._image_feed
        if feed is None and self._image_path:
            zero = ("images", "skipped", "cache_hits", "cache_misses", "cache_bytes", "cache_budget_bytes",
                    "cache_shared")
            out.update(dict.fromkeys(zero, 0), cache_hit_rate=0.0, images_per_s=0.0)
        elif feed is not None:
            cache = feed.cache
            hits, misses = (cache.hits, cache.misses) if cache is not None else (0, 0)
            out.update(
                images=feed.images,
                skipped=feed.skipped,
                cache_hits=hits,
                cache_misses=misses,
                cache_bytes=cache.nbytes if cache is not None else 0,
                cache_budget_bytes=cache.budget_bytes if cache is not None else 0,
                cache_shared=int(cache is not None and cache.shared),
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
        if self._context is not None and self._context_pid == os.getpid():
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


def explain(target: Any) -> str:
    """Where ``target`` runs, and why, as a few lines of text to print.

    - a loader: the path it takes, the image fast path or the generic one (per-sample
      ``__getitem__`` + collate), with the reason and the fix (``loader.stats()["path"]`` and
      ``["path_reason"]``); for a torch ``DataLoader``, the path a ``FastLoader`` with the same
      arguments would take; then, for a gpufeed image dataset, its transform as below;
    - a gpufeed image dataset (or a ``Subset`` of one): its transform as below; a detection
      dataset (``DetectionSource``): what runs per sample, and its pipeline's ops;
    - a transform (gpufeed's, a torchvision or timm pipeline, any callable, None): where each op
      runs (:func:`gpufeed.image.explain_transform`).
    """
    if isinstance(target, DataLoader):
        return explain_loader(target, isinstance(target, FastLoader))
    dataset = fast_dataset(target)
    if isinstance(dataset, (ImageSource, DetectionSource)):
        return explain_dataset(dataset)
    return explain_transform(target)


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

# torch's DataLoader parameters (the installed version's) and gpufeed's keyword-only options.
_TORCH_PARAMS = tuple(list(inspect.signature(DataLoader.__init__).parameters)[1:])
_OPTIONS = frozenset(
    name
    for name, p in inspect.signature(FastLoader.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in _TORCH_PARAMS
)


def _rebuild(cls: type[FastLoader[Any]], kwargs: dict[str, Any]) -> FastLoader[Any]:
    """Unpickle a loader: a fresh one made from its arguments."""
    return cls(**kwargs)
