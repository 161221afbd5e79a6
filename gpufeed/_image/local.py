"""The image fast path in the main process (``num_workers=0``): same batches as with workers."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data.dataloader import _BaseDataLoaderIter

from gpufeed._engine.layout import align_up
from gpufeed._image.fill import fill_batch


class LocalImageIter(_BaseDataLoaderIter):
    """Fills each batch in a fresh buffer; the cache is used directly (no staging)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        self._feed = loader._image_feed
        self._stats = loader._stats
        self._aug_epoch = loader._begin_epoch()

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._aug_epoch = loader._begin_epoch()

    def _next_data(self) -> Any:
        t0 = time.perf_counter()
        try:
            return self._fill_next()
        finally:
            self._stats.add_wait(time.perf_counter() - t0, 0)

    def _fill_next(self) -> Any:
        indices = self._next_index()  # StopIteration ends the epoch
        feed, plan = self._feed, self._feed.plan
        nbytes = align_up(plan.offsets(len(indices))[2])
        if plan.cache == "encoded":  # room for the encoded hits the feed stages in the buffer
            nbytes += sum(align_up(len(v)) for v in map(feed.cache.peek, indices) if v is not None)
        buf = torch.empty(nbytes, dtype=torch.uint8)
        task = feed.prepare(self._aug_epoch, indices, buf)
        staged: dict[int, bytes] = {}

        def stage(pos: int, data: Any) -> None:
            staged[pos] = bytes(data)
            return None

        batch, report = fill_batch(plan, feed.source, indices, task, lambda: buf,
                                   stage if plan.cache == "encoded" else None)
        self._stats.add_batch(samples=len(report.kept), fetch_s=0.0, collate_s=0.0, pack_s=0.0, report=report)
        feed.absorb(indices, task, report, buf)
        if feed.cache is not None:
            for pos, data in staged.items():
                feed.cache.put(indices[pos], data)
        if self._pin_memory:
            batch = tuple(t.pin_memory() for t in batch)
        return batch
