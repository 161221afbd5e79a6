"""The parent side of the per-sample fast path (detection/segmentation: ``docs/design/
detection.md``): whether a loader over a ``DetectionSource`` takes it, its plan, and
``SampleFeed``, the engine's ``FillPlugin`` (with ``cache_bytes``, a host cache of each sample's
read: its encoded bytes and record, as the image path caches encoded bytes under random ops).

The path is the image path's per-sample form: ``loader.stats()["path"]`` is ``"image"`` for it
too (the image fast path, as against the generic ``__getitem__`` + collate), and
``gpufeed.explain(loader)`` tells the two forms apart. Any ``collate_fn`` runs on it, in the
workers; the image path's batch options (``channels_last``, ``normalize``, ``dtype``,
``batch_transform``) are refused: the pipeline's own ``ToDtype`` / ``Normalize`` set the output.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from gpufeed._engine.plugin import FillPlugin, LookUp, PassTag
from gpufeed._fastpath.counts import SkipCounts
from gpufeed._fastpath.host_cache import make_host_cache, put_staged, source_parts, write_hits
from gpufeed._fastpath.subsets import SubsetIndex, SubsetMapped, fast_dataset, subset_index
from gpufeed.cache import HostCache
from gpufeed.cache._shared import CacheNamespace, fingerprint
from gpufeed.errors import GpufeedWarning, describe_callable
from gpufeed.image._sample_fill import SampleFiller, SamplePlan, SampleReport, SampleTask
from gpufeed.image.detection import DetectionPipeline, translate_detection
from gpufeed.sources import ImageSource
from gpufeed.sources._detection import DetectionSource

#: ``explain(loader)``'s name of this path.
SAMPLE_PATH = "the image path (per sample: variable sizes, collate_fn in the workers)"

#: The image path's batch options, which a per-sample loader refuses: (name, key in
#: ``make_image_feed``'s keywords, default).
_IMAGE_ONLY = (("channels_last", "channels_last", False), ("normalize", "normalize", None),
               ("dtype", "dtype", None), ("batch_transform", "batch_transform", None))


#: What the generic path is, in the warning and in ``gpufeed.explain(loader)``.
GENERIC_PATH = "the generic path (per-sample __getitem__ + collate in the workers, slower)"


def warn_generic_path(loader: Any, blocker: str, stacklevel: int) -> None:
    """Warn (``GpufeedWarning``) that ``loader``, over a gpufeed image dataset, takes the generic
    path: why, and the fix (``blocker``). A loader over any other dataset is not warned about:
    the generic path is the only one it has."""
    if not isinstance(fast_dataset(loader.dataset), (ImageSource, DetectionSource)):
        return
    warnings.warn(GpufeedWarning(
        f"gpufeed: this loader of {type(loader.dataset).__name__} takes {GENERIC_PATH}, not "
        f"the image fast path: {blocker}. gpufeed.explain(loader) says more."),
        stacklevel=stacklevel + 1)


def sample_path_blocker(loader: Any) -> str | None:
    """Why ``loader`` (over a ``DetectionSource``) cannot take the per-sample fast path, and the
    fix, or None if it can. Any ``collate_fn`` can."""
    pipeline = fast_dataset(loader.dataset).transforms
    if pipeline is None:
        return ("the detection dataset has no `transforms`, so its samples are PIL images run "
                "through __getitem__; give it a torchvision v2 pipeline gpufeed translates (at "
                "least ToImage()) for the fast path")
    if not isinstance(pipeline, DetectionPipeline):
        _, report = translate_detection(pipeline)
        return (f"the dataset's transforms ({describe_callable(pipeline)}) is not a pipeline gpufeed "
                f"translates ({report}), so it runs as given in workers on PIL images and "
                "tv_tensors; use the torchvision v2 ops gpufeed translates, or move a PIL-only op "
                "after ToImage() as a tensor op (gpufeed.explain(dataset) shows the pipeline)")
    if loader.batch_sampler is None:
        return ("batch_size=None disables batching; give a batch_size (or a batch_sampler) for "
                "the fast path")
    return None


def check_sample_options(options: dict[str, Any]) -> None:
    """``ValueError`` naming the image-path options given to a loader over a ``DetectionSource``
    (``options``: ``make_image_feed``'s keywords)."""
    given = [name for name, key, default in _IMAGE_ONLY if options.get(key, default) not in (default, None)]
    if given:
        names = ", ".join(f"`{g}`" for g in given)
        raise ValueError(
            f"{names} {'applies' if len(given) == 1 else 'apply'} to image classification batches, not to a "
            f"detection dataset's samples (images of any size, collated by your collate_fn). Drop "
            f"{'it' if len(given) == 1 else 'them'}: put ToDtype(torch.float32, scale=True) and "
            "Normalize(mean, std) in the dataset's transforms (they run on each sample, in the workers).")


def make_sample_feed(loader: Any, *, on_error: str, seed: int | None, cache_budget: int = 0,
                     cache_scope: str = "rank", cache_text: str = "", dry_run: bool = False,
                     **options: Any) -> SampleFeed | None:
    """The loader's ``SampleFeed``, or None for the generic path (then ``seed``/``on_error``/
    ``cache_bytes`` are errors, and with ``announce`` the generic path is warned about once).
    ``cache_budget`` > 0: a host cache of each sample's read (encoded bytes and record), made as
    the image path makes its own (``cache_scope``, ``cache_text``; none for a ``dry_run``).
    ``options``: the image path's other keywords (``make_image_feed``'s): the batch options
    are refused."""
    check_sample_options(options)
    blocker = sample_path_blocker(loader)
    if blocker is not None:
        given = [name for name, value, default in (("on_error", on_error, "raise"), ("seed", seed, None),
                                                   ("cache_bytes", cache_budget, 0))
                 if value != default]
        if given:
            raise ValueError(
                f"{', '.join(f'`{g}`' for g in given)} only {'applies' if len(given) == 1 else 'apply'} to "
                f"the fast path, which this loader cannot take: {blocker}. Or drop these options.")
        if options.get("announce"):
            warn_generic_path(loader, blocker, stacklevel=4)
        return None
    source = fast_dataset(loader.dataset)
    pipeline: DetectionPipeline = source.transforms
    if seed is None:
        seed = pipeline.seed if pipeline.seed is not None else _default_seed(loader.generator)
    plan = SamplePlan(pipeline=pipeline, collate_fn=loader.collate_fn, seed=int(seed), on_error=on_error,
                      cache=cache_budget > 0)
    cache = None
    if cache_budget and not (dry_run and cache_scope != "rank"):
        cache = make_host_cache(lambda: fingerprint(["samples", *source_parts(source)]), len(source),
                                cache_budget, cache_text, cache_scope)
    return SampleFeed(plan, source, cache, subset_index(loader.dataset))


def _default_seed(generator: torch.Generator | None) -> int:
    # initial_seed() does not advance the generator, as on the image path
    return (generator.initial_seed() if generator is not None else torch.initial_seed()) % (1 << 63)


def explain_samples(dataset: DetectionSource) -> Sequence[str]:
    """``explain(loader)``'s lines for the per-sample path: where things run, then the ops."""
    pipeline: DetectionPipeline = dataset.transforms
    lines = ["per sample, in the workers: read, decode (stored orientation; a baseline JPEG only down to "
             "the last row the ops read), target_of, the joint ops:"]
    lines += [f"  {line}" for line in pipeline.describe()] or ["  (none)"]
    out = "tv_tensors" if not pipeline.pure else "plain tensors"
    lines.append(f"then the output stage ({pipeline.image_dtype}, {out}; the image written into the "
                 "batch's shared-memory slot) and your collate_fn on the batch's samples.")
    return lines


class SampleFeed(SkipCounts, SubsetMapped, FillPlugin):
    """Parent side of the per-sample path (the engine's ``FillPlugin``): per-task epochs, the
    host cache of each sample's read (looked up at submission, the hits written at the start of
    the task's slot; the reads a worker staged there added when the batch is handed out), and
    the counts of images and skipped samples; ``filler`` is the worker side."""

    def __init__(self, plan: SamplePlan, source: Any, cache: HostCache | CacheNamespace | None = None,
                 index_map: SubsetIndex | None = None) -> None:
        self.plan = plan
        self.index_map = index_map  # the loader's dataset is a Subset of ``source`` (``task_index``)
        self.filler = SampleFiller(plan)
        self.source = source
        self.cache = cache if plan.cache else None
        self.gpu_transform = None  # the pipeline sets the dtype: nothing runs after the copy
        SkipCounts.__init__(self)

    @property
    def parent_binds(self) -> bool:
        """With a cache, ``prepare`` writes the hits into the task's slot."""
        return self.cache is not None

    def look_up(self, tag: PassTag, indices: list[int], count: bool = True) -> LookUp:
        """The cache's blobs for the batch (one ``get_many``, counted); never the whole batch:
        every sample runs its random ops in a worker."""
        if self.cache is None:
            return LookUp(None)
        hits = self.cache.get_many(indices, count)
        return LookUp(hits, writes=any(hit is not None for hit in hits))

    def prepare(self, tag: PassTag, indices: list[int], buf: torch.Tensor | None, count: bool = True,
                found: list[Any] | None = None) -> SampleTask:
        """The task: its epoch and batch number, and the cache's blobs written into ``buf`` (the
        slot) one after another from its start (``found``: ``look_up``'s, else looked up now;
        ``count=False`` for a task prepared again after a worker died)."""
        task = SampleTask(tag.epoch, tag.batch)
        if self.cache is None or buf is None:
            return task
        hits = self.cache.get_many(indices, count) if found is None else found
        task.given, task.staging_used = write_hits(buf, hits, 0)
        return task

    def absorb(self, indices: list[int], task: SampleTask, report: SampleReport, buf: torch.Tensor | None) -> None:
        """Count the batch; log each skipped file once; add the reads the worker staged to the
        cache."""
        self.count(report)
        if self.cache is not None and buf is not None:
            put_staged(self.cache, indices, report.staged, buf)
