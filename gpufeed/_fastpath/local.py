"""The image fast path in the main process (``num_workers=0``): same batches as with workers
(``LocalImageIter``; ``LocalSampleIter`` for the per-sample form)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter

from gpufeed._engine.layout import align_up
from gpufeed._engine.plugin import PassTag
from gpufeed._fastpath.feed import ImageFeed
from gpufeed._fastpath.samples import SampleFeed
from gpufeed._resume.indices import pulled_number
from gpufeed.image._fill import fill_batch
from gpufeed.image._sample_fill import fill_samples
from gpufeed.stats import Stats


class _LocalIter(_BaseDataLoaderIter):
    """A fast path's batches made in the main process (``num_workers=0``): ``_fill_next`` makes
    one; the wait for it is counted in the loader's stats."""

    def __init__(self, loader: Any, feed: Any, stats: Stats, aug_epoch: int) -> None:
        super().__init__(loader)
        self._feed = feed
        self._stats = stats
        self._aug_epoch = aug_epoch
        self._pulls = 0  # batches taken from the index stream

    def _next_data(self) -> Any:
        t0 = time.perf_counter()
        try:
            return self._fill_next()
        finally:
            self._stats.add_wait(time.perf_counter() - t0, 0)

    def _fill_next(self) -> Any:
        raise NotImplementedError


class LocalImageIter(_LocalIter):
    """Fills each batch in a fresh buffer; the cache is used directly (no staging).

    ``loader`` is read for torch's own attributes only; ``aug_epoch`` is this pass's
    augmentation epoch (a loader makes a new iterator for every pass at ``num_workers=0``).
    """

    _feed: ImageFeed

    def _fill_next(self) -> Any:
        indices = self._feed.task_index(self._next_index())  # StopIteration ends the epoch
        feed, plan = self._feed, self._feed.plan
        nbytes = align_up(plan.layout(len(indices)).staging)
        cache = feed.cache
        if plan.cache == "encoded" and cache is not None:  # room for the encoded hits the feed stages
            nbytes += sum(align_up(len(v)) for v in map(cache.peek, indices) if v is not None)
        buf = torch.empty(nbytes, dtype=torch.uint8)
        tag = PassTag(self._aug_epoch, pulled_number(self._index_sampler, self._pulls))
        self._pulls += 1
        task = feed.prepare(tag, indices, buf)
        staged: dict[int, bytes] = {}

        def stage(pos: int, data: Any) -> None:
            staged[pos] = bytes(data)

        batch, report = fill_batch(plan, feed.source, indices, task, lambda: buf,
                                   stage if plan.cache == "encoded" else None)
        self._stats.add_batch(samples=len(report.kept), fetch_s=0.0, collate_s=0.0, pack_s=0.0, report=report)
        feed.absorb(indices, task, report, buf)
        if feed.cache is not None:
            for pos, data in staged.items():
                feed.cache.put(indices[pos], data)
        if self._pin_memory:
            images, targets, *params = batch  # params: a batch op's, for the GPU (device="cuda")
            batch = (images.pin_memory(), pin_memory(targets), *params)  # torch's rule for any structure
        return batch


class LocalSampleIter(_LocalIter):
    """The per-sample path in the main process: each sample read, decoded and transformed in
    turn (images in torch's memory), then the loader's ``collate_fn``; the same batches as with
    workers (the draws are keyed by seed, epoch and index)."""

    _feed: SampleFeed

    def _fill_next(self) -> Any:
        indices = self._feed.task_index(self._next_index())  # StopIteration ends the epoch
        feed = self._feed
        tag = PassTag(self._aug_epoch, pulled_number(self._index_sampler, self._pulls))
        self._pulls += 1
        task = feed.prepare(tag, indices, None)
        cache = feed.cache
        supplied: dict[int, Any] | None = None
        staged: dict[int, bytes] = {}  # position -> blob: the reads kept for the cache
        if cache is not None:  # used directly: the hits are the cache's values, the reads kept here
            hits = cache.get_many(indices)
            supplied = {pos: hit for pos, hit in enumerate(hits) if hit is not None}
        batch, report = fill_samples(feed.plan, feed.source, indices, task, None, supplied=supplied,
                                     stage=None if cache is None else staged.__setitem__)
        self._stats.add_batch(samples=len(report.kept), fetch_s=0.0, collate_s=0.0, pack_s=0.0, report=report)
        feed.absorb(indices, task, report, None)
        if cache is not None:
            for pos, blob in staged.items():
                cache.put(indices[pos], blob)
        return pin_memory(batch) if self._pin_memory else batch
