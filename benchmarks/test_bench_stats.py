"""Stats are cheap enough to leave on: the per-batch bookkeeping next to one batch's transport.

Run: ``pytest benchmarks/test_bench_stats.py --benchmark-only``. Read the ratio of the two means
(bookkeeping per batch / transport per batch), not the lone timings.

Private import: ``gpufeed.image._fill.FillReport``, the report the bookkeeping it measures reads.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from gpufeed import FastLoader
from gpufeed.image._fill import FillReport
from gpufeed.stats import Stats

BATCH = 64


def _per_batch_bookkeeping(stats: Stats, report: FillReport) -> None:
    # Exactly what the iterator does per batch: one add_wait and one add_batch.
    stats.add_wait(0.001, 2)
    stats.add_batch(samples=BATCH, fetch_s=0.001, collate_s=0.001, pack_s=0.0001, report=report)


def test_stats_bookkeeping_per_batch(benchmark):
    stats, report = Stats(), FillReport(kept=list(range(BATCH)), read_s=0.01, decode_s=0.1)
    benchmark(_per_batch_bookkeeping, stats, report)


def test_stats_snapshot(benchmark):
    stats = Stats()
    _per_batch_bookkeeping(stats, FillReport())
    benchmark(stats.snapshot)


@pytest.mark.timeout(120)
def test_transport_per_batch_for_scale(benchmark):
    """One batch of 64 x 3x64x64 uint8 through FastLoader (2 workers): the denominator."""
    ds = TensorDataset(torch.zeros(64 * 50, 3, 64, 64, dtype=torch.uint8))
    loader = FastLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    it = iter(loader)

    def one_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    benchmark(one_batch)
    loader.close()
