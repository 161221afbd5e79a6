"""The parent side of the image path: deciding whether a loader takes it, building its plan, and
the ``ImageFeed`` (cache look-ups before a batch is dispatched, cache fills after)."""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate

from gpufeed._engine.plugin import Completed, FillPlugin, LookUp, PassTag
from gpufeed._fastpath.counts import SkipCounts
from gpufeed._fastpath.host_cache import make_host_cache, put_staged, source_parts, write_hits
from gpufeed._fastpath.samples import sample_path_blocker, warn_generic_path
from gpufeed._fastpath.subsets import SubsetIndex, SubsetMapped, fast_dataset, subset_index
from gpufeed.cache import HostCache
from gpufeed.cache._shared import CacheNamespace, fingerprint
from gpufeed.cuda._transform import GpuTransform
from gpufeed.errors import GpufeedWarning
from gpufeed.image._batch_ops import BatchOp, batch_op_from
from gpufeed.image._fill import FillReport, ImageFiller, ImagePlan, ImageTask
from gpufeed.image._torchvision import is_torchvision, untranslated_reasons
from gpufeed.image._views import MultiView
from gpufeed.sources import ImageFolder, ImageSource, LMDBDataset
from gpufeed.sources._base import describe_callable
from gpufeed.sources._detection import DetectionSource

log = logging.getLogger(__name__)


def _image_options_given(channels_last, normalize, dtype, on_error, cache_budget, seed,
                         batch_transform=None) -> list[str]:
    given = []
    for name, value, default in (
        ("batch_transform", batch_transform, None),
        ("channels_last", channels_last, False),
        ("normalize", normalize, None),
        ("dtype", dtype, None),
        ("on_error", on_error, "raise"),
        ("cache_bytes", cache_budget, 0),
        ("seed", seed, None),
    ):
        if value != default:
            given.append(name)
    return given


def fast_path_blocker(loader: Any) -> str | None:
    """Why ``loader`` cannot take the image fast path, and the fix, or None if it can (over a
    ``DetectionSource``: its per-sample form, ``gpufeed._fastpath.samples``). A Subset of a
    gpufeed dataset is judged by the dataset under it (``gpufeed._fastpath.subsets``)."""
    dataset = fast_dataset(loader.dataset)
    if isinstance(dataset, DetectionSource):
        return sample_path_blocker(loader)
    if not isinstance(dataset, ImageSource):
        return f"the dataset is a {type(dataset).__name__}, not a gpufeed image dataset"
    if isinstance(dataset.transform, MultiView) and not dataset.transform.translated:
        return (f"the transform is a MultiView with a pipeline gpufeed does not translate, so "
                f"every pipeline runs as given in workers on PIL images "
                f"({'; '.join(dataset.transform.blockers)}); gpufeed.explain(dataset.transform) "
                f"says where each op runs")
    if dataset.calls_transform and is_torchvision(dataset.transform):
        return ("the transform is a torchvision pipeline gpufeed does not translate, run as "
                f"given in workers on PIL images ({untranslated_reasons(dataset.transform)}); "
                "gpufeed.explain(dataset.transform) says where each op runs")
    if dataset.calls_transform:
        return (f"the transform is a user callable: {describe_callable(dataset.transform)} runs "
                f"in workers on PIL images; use gpufeed.ResizeCenterCrop / RandomResizedCrop for "
                f"the fast path")
    if dataset.loader is not None:
        return (f"the dataset has a `loader` ({describe_callable(dataset.loader)}), which the "
                f"fast path does not call (it decodes the bytes itself); drop `loader` for the "
                f"fast path")
    if dataset.transform is None:
        return ("the image dataset has no transform (images of different sizes cannot be "
                "batched); give it one, e.g. transform=gpufeed.ResizeCenterCrop(224, 256)")
    if loader.batch_sampler is None:
        return ("batch_size=None disables batching; give a batch_size (or a batch_sampler) for "
                "the fast path")
    if loader.collate_fn is not default_collate:
        return (f"a custom collate_fn is used ({describe_callable(loader.collate_fn)}); drop it "
                f"for the fast path, whose batches are (images [N, 3, H, W], labels int64 [N]), "
                f"and do its work on those batches")
    return None


def make_image_feed(
    loader: Any,
    *,
    channels_last: bool,
    normalize: tuple[Sequence[float], Sequence[float]] | None,
    dtype: torch.dtype | None,
    on_error: str,
    cache_budget: int,
    seed: int | None,
    on_gpu: bool = False,
    announce: bool = False,
    cache_scope: str = "rank",
    cache_text: str = "",
    dry_run: bool = False,
    batch_transform: Any = None,
) -> ImageFeed | None:
    """The loader's ImageFeed, or None for the generic path (where image options are errors).

    ``on_gpu``: uint8 crosses PCIe and dtype/normalize run on the GPU (``feed.gpu_transform``).
    ``announce``: warn (``warn_generic_path``) when an image dataset's loader takes the
    generic path; the loader asks once, at construction, not again when each process makes its
    feed.
    ``cache_scope``: ``"rank"``, ``"host"`` or ``"auto"`` (``make_cache``); ``cache_text``: the
    ``cache_bytes`` given, as text (the host cache compares it); ``dry_run``: a check of the
    options at construction, which attaches to no host cache. ``batch_transform``: MixUp/CutMix
    (``gpufeed.image._batch_ops.batch_op_from``).
    """
    batch_op = None if batch_transform is None else batch_op_from(batch_transform)
    blocker = fast_path_blocker(loader)
    source = fast_dataset(loader.dataset)
    if blocker is not None:
        given = _image_options_given(channels_last, normalize, dtype, on_error, cache_budget, seed,
                                     batch_transform)
        user_callable = getattr(source, "calls_transform", False)
        if given:
            fix = ("Or drop these options and do their work in your transform (e.g. "
                   "torchvision's Normalize)." if user_callable else
                   "Use gpufeed.ImageFolder / ImageDataset / LMDBDataset with a transform and "
                   "the default collate_fn, or drop these options.")
            raise ValueError(
                f"{', '.join(f'`{g}`' for g in given)} only {'applies' if len(given) == 1 else 'apply'} "
                f"to the image fast path, which this loader cannot take: {blocker}. {fix}"
            )
        if announce:
            warn_generic_path(loader, blocker, stacklevel=4)  # the caller of FastLoader(...)
        return None
    # A translated torchvision pipeline brings its own Normalize/dtype (gpufeed.image).
    normalize, dtype = source.transform.batch_options(normalize, dtype)
    if normalize is not None:
        mean, std = normalize
        normalize = (tuple(float(m) for m in mean), tuple(float(s) for s in std))
    if dtype is None:
        dtype = torch.float32 if normalize is not None else torch.uint8
    transform = source.transform
    if seed is None:
        seed = transform.seed if transform.seed is not None else _default_seed(loader.generator)
    if on_gpu and transform.float_ops and dtype != torch.uint8:
        # Float ops (RandomErasing) run on the normalized rows of each sample, which the GPU
        # transform sees only as a whole batch: normalize stays in the workers.
        warnings.warn(
            f"gpufeed: the transform's float ops ({', '.join(op.name for op in transform.float_ops)}) "
            "run on the normalized rows in the workers, so dtype/normalize run there too instead "
            "of on the GPU (float batches cross PCIe: 4x the bytes of uint8). Drop the float ops "
            "to normalize on the GPU.", GpufeedWarning, stacklevel=2)
        on_gpu = False
    targets = target_route(source)
    if batch_op is not None:
        check_batch_op(batch_op, batch_transform, dtype, targets, transform)
    gpu_transform = GpuTransform(dtype, normalize, bool(channels_last), batch_op) if on_gpu else None
    plan = ImagePlan(
        transform=transform,
        channels_last=bool(channels_last),
        on_error=on_error,
        normalize=None if on_gpu else normalize,
        dtype=torch.uint8 if on_gpu else dtype,
        seed=int(seed),
        cache=None if cache_budget == 0 else _cache_kind(transform, batch_op, on_gpu),
        targets=targets,
        batch_op=batch_op,
        batch_op_on_gpu=on_gpu,
    )
    batch = loader.batch_size or 1
    need = plan.layout(batch).planned_bytes
    if need > loader.engine_config.max_batch_bytes:
        raise ValueError(
            f"a batch of {batch} images of {plan.describe_sizes()} ({dtype}) needs {need} bytes of arena slot; "
            f"`max_batch_bytes` is {loader.engine_config.max_batch_bytes}. Raise max_batch_bytes "
            "or lower batch_size."
        )
    cache = None
    if cache_budget and not (dry_run and cache_scope != "rank"):
        cache = make_cache(plan, source, cache_budget, cache_text, cache_scope)
    return ImageFeed(plan, source, cache, gpu_transform, subset_index(loader.dataset))


def check_batch_op(op: BatchOp, given: Any, dtype: torch.dtype, targets: str, transform: Any) -> None:
    """``ValueError`` when ``op`` cannot run on this loader's batches: a ``MultiView`` (a batch
    op mixes one image batch), a MixUp on uint8 output (torchvision's MixUp refuses uint8 too), or
    targets that are not the source's int labels."""
    name = type(given).__name__
    if isinstance(transform, MultiView):
        raise ValueError(
            f"`batch_transform` {name} mixes one batch of images, and the dataset's transform is a "
            f"MultiView of {len(transform.views)} views. Drop batch_transform, or mix the views "
            "in your training step.")
    if op.mixes_pixels and dtype == torch.uint8:
        raise ValueError(
            f"`batch_transform` {name} blends pixels (MixUp), which needs a float batch; the "
            "output dtype is torch.uint8. Pass normalize=(mean, std) or dtype=torch.float32 "
            "(with device='cuda', uint8 still crosses PCIe and the GPU converts), or use CutMix "
            "alone, which works on uint8.")
    if targets != "labels":
        raise ValueError(
            f"`batch_transform` {name} mixes int class labels into soft targets, and this "
            "loader's targets are not the dataset's int labels (a target_transform, or targets "
            "of another type). Drop the target_transform, or mix in your training step.")


def explain_batch_op(given: Any, on_gpu: bool) -> str:
    """``explain(loader)``'s line for a ``batch_transform``: what gpufeed runs, and where."""
    where = ("on the GPU after normalize, with parameters drawn in the workers" if on_gpu else
             "in the workers after the fill (CutMix pasted on the uint8 rows, MixUp fused into the "
             "dtype/normalize pass)")
    return f"batch_transform: {batch_op_from(given).describe()}, {where}; soft float32 targets."


def _cache_kind(transform: Any, batch_op: BatchOp | None, on_gpu: bool) -> str:
    """``"decoded"`` rows for a deterministic single-view transform, else ``"encoded"`` bytes. A
    ``MultiView`` caches bytes (its decoded rows, one entry of every view, are not built yet;
    docs/design/sample-model.md, section 3). A batch op run in the workers pastes CutMix boxes
    into the uint8 rows the decoded cache would keep, so with one the cache holds encoded bytes
    (with ``device="cuda"`` the GPU mixes: the rows stay)."""
    if transform.deterministic and not isinstance(transform, MultiView) and (batch_op is None or on_gpu):
        return "decoded"
    return "encoded"


def target_route(source: Any) -> str:
    """``"labels"`` (int64 labels in the slot) when every target is the source's int label and
    there is no ``target_transform``, else ``"collate"`` (``gpufeed.image._targets``)."""
    return "labels" if source.int_targets and source.target_transform is None else "collate"


def cache_fingerprint(plan: ImagePlan, source: Any) -> bytes:
    """What makes the cached values of ``source`` under ``plan`` (docs/design/host-cache.md):
    the dataset (class, repr, length, labels, 16 samples' ``describe``), the kind of value,
    and for decoded rows the transform and the output geometry."""
    parts = [plan.cache or "", *source_parts(source)]
    table = _label_table(source)
    if table is not None:
        parts.append(hashlib.blake2b(table.tobytes(), digest_size=16).hexdigest())
    if plan.cache == "decoded":
        parts += [repr(plan.transform), str(plan.hw), str(plan.channels_last), str(plan.row_bytes)]
    return fingerprint(parts)


def make_cache(plan: ImagePlan, source: Any, budget: int, text: str, scope: str) -> HostCache | CacheNamespace | None:
    """The loader's cache: its own LRU, or its namespace of the job's host cache
    (``cache_scope``; docs/design/host-cache.md, "Which loaders share")."""
    return make_host_cache(lambda: cache_fingerprint(plan, source), len(source), budget, text, scope)


def _default_seed(generator: torch.Generator | None) -> int:
    # initial_seed() does not advance the generator, so sampling order is unaffected.
    return (generator.initial_seed() if generator is not None else torch.initial_seed()) % (1 << 63)


def _label_table(source: Any) -> np.ndarray | None:
    """The source's int64 label array when its ``label(i)`` is that array's item ``i``
    (``ImageFolder``, ``LMDBDataset``, not a subclass that overrides ``label``), else None."""
    if type(source).label not in (ImageFolder.label, LMDBDataset.label):
        return None
    table = source.labels
    if not isinstance(table, np.ndarray) or table.dtype != np.int64 or table.ndim != 1:
        return None
    return table


@dataclass(slots=True)
class ParentBatch:
    """A batch whose every row the cache held at submission: made in the parent (``complete``)."""

    epoch: int
    rows: list[Any]  # the cached rows, in batch order


class ImageFeed(SkipCounts, SubsetMapped, FillPlugin):
    """Parent side of the image path (the engine's ``FillPlugin``): cache look-ups before
    dispatch, cache fills after; ``filler`` is the worker side. ``index_map``: the loader's
    dataset is a Subset of ``source``; the tasks carry ``source``'s indices (``task_index``)."""

    def __init__(self, plan: ImagePlan, source: Any, cache: HostCache | CacheNamespace | None,
                 gpu_transform: Any = None, index_map: SubsetIndex | None = None) -> None:
        self.plan = plan
        self.index_map = index_map
        self.filler = ImageFiller(plan)
        self.gpu_transform = gpu_transform  # dtype/normalize applied after the copy to the GPU
        self.source = source
        self.cache = cache if plan.cache else None
        SkipCounts.__init__(self)
        self._label_table = _label_table(source) if plan.targets == "labels" else None

    @property
    def parent_binds(self) -> bool:
        """With a cache, ``prepare`` writes the hits into the task's slot."""
        return self.cache is not None

    def look_up(self, tag: PassTag, indices: list[int], count: bool = True) -> LookUp:
        """Look the batch up in the cache at submission (one ``get_many``, counted).

        When the decoded cache holds every row, the output is uint8 and the targets are int
        labels, the batch is made in the parent when it is handed out (``complete``; targets
        of other kinds are collated, and ``target_transform`` run, in workers only):
        ``LookUp.report`` is set, and the
        cached rows travel in ``LookUp.extra`` (a ``ParentBatch``; a row evicted meanwhile stays
        alive until it is copied). Otherwise ``extra`` is what was found, for ``prepare``.

        A float batch goes to a worker even when all its rows are hits: its dtype pass costs
        about 15x the row copies (25 ms of main-process CPU against 1.5 ms for 64 x 3x224x224,
        measured), and in the main process it ran serially: a fully cached float32 epoch took
        0.60 s there against 0.47 s with workers started for it (2 cores, benchmarks/
        cache_epochs.py). With ``device="cuda"`` the batch is uint8 on the host (dtype and
        normalize run on the GPU), so it is made here.
        """
        if self.cache is None:
            return LookUp(None)
        hits = self.cache.get_many(indices, count)
        n = len(indices)
        if (self.plan.cache == "decoded" and self.plan.dtype == torch.uint8 and n > 0
                and self.plan.targets == "labels" and self.plan.batch_op is None
                and all(hit is not None for hit in hits)):
            return LookUp(ParentBatch(tag.epoch, hits), FillReport(kept=list(range(n))))
        return LookUp(hits, writes=any(hit is not None for hit in hits))

    def prepare(self, tag: PassTag, indices: list[int], buf: torch.Tensor | None, count: bool = True,
                found: list[Any] | None = None) -> ImageTask:
        """Write cache hits into ``buf`` (the slot) and say which rows are done.

        ``count=False`` for a batch prepared again (re-run after a worker death): its look-ups
        were already counted as hits and misses. ``found``: what ``look_up`` found at
        submission (then the cache is not looked up again).
        """
        task = ImageTask(tag.epoch, tag.batch)
        if self.cache is None or buf is None:
            return task
        hits = self.cache.get_many(indices, count) if found is None else found
        n = len(indices)
        staging = self.plan.layout(n).staging
        if self.plan.cache == "decoded":
            task.done = self._write_rows(hits, buf)
        else:
            task.given, end = write_hits(buf, hits, staging)
            task.staging_used = end - staging
        return task

    def _write_rows(self, hits: Sequence[Any], buf: torch.Tensor) -> tuple[int, ...]:
        """Copy the decoded rows found (None: a miss) into their places in ``buf``; returns
        their positions. One memcpy per row, straight from the cached (64-byte aligned) row."""
        row_bytes = self.plan.row_bytes
        rows = buf[: len(hits) * row_bytes].numpy().data  # flat uint8 memoryview: slice assignment is a memcpy
        done = []
        start = 0
        for pos, hit in enumerate(hits):
            if hit is not None:
                rows[start : start + row_bytes] = hit
                done.append(pos)
            start += row_bytes
        return tuple(done)

    def complete(self, indices: list[int], task: ParentBatch, buf: torch.Tensor) -> Completed:
        """Make a batch ``look_up`` found whole in the cache, in ``buf`` (the slot, bound as the
        batch is handed out): the rows, then the labels, written as a worker writes them, so the
        bytes are the same."""
        n = len(indices)
        t0 = time.perf_counter()
        plan = self.plan
        done = self._write_rows(task.rows, buf)
        if len(done) != n:  # look_up checked every row: a broken invariant, not a user error
            raise RuntimeError(f"gpufeed: a parent-made batch of {n} samples had {len(done)} cached rows")
        labels = plan.layout(n).labels.of(buf).view(torch.int64)
        if self._label_table is not None:
            np.take(self._label_table, indices, out=labels.numpy())
        else:
            labels.numpy()[:] = np.fromiter(map(self.source.label, indices), np.int64, n)
        images = plan.rows(buf, n)
        if plan.channels_last:
            images = images.permute(0, 3, 1, 2)  # NCHW shape, NHWC memory
        # (its seconds are the main process's: the engine counts them as stats' parent_s)
        report = FillReport(kept=list(range(n)), post_s=time.perf_counter() - t0)
        # The layout (where the rows and labels lie, their shapes) depends on n alone: the
        # engine packs the skeleton once per batch size.
        return Completed((images, labels), report, layout=("rows", n))

    def absorb(self, indices: list[int], task: ImageTask | ParentBatch, report: FillReport, buf: torch.Tensor) -> None:
        """Count the batch; add what the worker produced to the cache; log skips once per file."""
        self.count(report)
        if self.cache is None:
            return
        if isinstance(task, ParentBatch):
            return  # every row came from the cache
        if self.plan.cache == "decoded":
            if len(task.done) == len(report.kept) == len(indices):
                return  # every row came from the cache
            done = set(task.done)
            rows = self.plan.rows(buf, len(indices)).numpy().reshape(len(indices), -1)
            new = [(indices[pos], rows[row]) for row, pos in enumerate(report.kept) if pos not in done]
            self.cache.put_rows([key for key, _ in new], [row for _, row in new])
        else:
            put_staged(self.cache, indices, report.staged, buf)
