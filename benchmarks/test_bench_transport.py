"""Transport: one epoch of NUM_BATCHES batches of 64 x 3x224x224 uint8 through num_workers=2,
per loader (DataLoader, FastLoader), worker start-up included.

    pytest benchmarks/test_bench_transport.py --benchmark-only

pytest-benchmark runs one loader's rounds, then the other's: compare the two rows of the group
(the ``(x.xx)`` factors), never a lone time. For the alternating, one-run ratio quoted in
results, use ``python -m benchmarks.transport``.
"""

from __future__ import annotations

import pytest

from gpufeed.compare import PeakPSS
from gpufeed.compare._compare import touch_pages
from gpufeed.compare._datasets import SyntheticImageDataset

NUM_BATCHES = 100
BATCH_SIZE = 64
NUM_WORKERS = 2
ROUNDS = 5


@pytest.mark.timeout(120)
def test_transport(benchmark, loader_cls: type) -> None:
    dataset = SyntheticImageDataset(NUM_BATCHES * BATCH_SIZE)

    def one_epoch() -> int:
        loader = loader_cls(dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
        n = 0
        for batch in loader:
            touch_pages(batch)
            n += 1
        del loader
        return n

    benchmark.group = "transport"
    with PeakPSS() as mem:
        n = benchmark.pedantic(one_epoch, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    assert n == NUM_BATCHES
    benchmark.extra_info.update(
        {
            "num_batches": NUM_BATCHES,
            "batch_size": BATCH_SIZE,
            "num_workers": NUM_WORKERS,
            "sample_shape": list(dataset.shape),
            "peak_pss_bytes": mem.peak_bytes,
        }
    )
