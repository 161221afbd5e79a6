"""When the parent gives warm slots' pages back while it waits for data: only when the loader
stalls (a wait of several task times), not between two batches of a steady stream, where the
slot waiting is the one the next worker writes (emptying it costs the parent a madvise and that
worker a refault; docs/design/engine-lifecycle.md, "Trimming")."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

from gpufeed import FastLoader

BATCH = 4
SAMPLE_S = 0.005  # a batch takes a worker about 20 ms (sleeping: steady on a loaded machine)


class Paced(Dataset):
    """64 KiB uint8 samples that take ``SAMPLE_S`` each to load; sample ``stall_at`` takes
    ``stall_s`` instead (storage that stops answering for a while)."""

    def __init__(self, n: int, stall_at: int = -1, stall_s: float = 0.0) -> None:
        self.n, self.stall_at, self.stall_s = n, stall_at, stall_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.stall_s if i == self.stall_at else SAMPLE_S)
        return torch.full((64, 1024), i % 256, dtype=torch.uint8)


def loader_of(ds: Paced) -> FastLoader:
    # One worker, one task in flight: while the consumer waits, the slot it just freed waits
    # in the arena for the worker's next batch.
    return FastLoader(ds, batch_size=BATCH, num_workers=1, prefetch_factor=1, persistent_workers=True)


@pytest.mark.timeout(120)
def test_a_steady_stream_keeps_its_warm_slots():
    loader = loader_of(Paced(40 * BATCH))
    batches = 0
    for x in loader:
        assert x.shape == (BATCH, 64, 1024)
        batches += 1
    emptied = loader._arena.emptied
    loader.close()
    # The consumer waits ~20 ms for each batch with a freed slot waiting: a 10 ms idle rule
    # emptied it every time (about 40); now only a hiccup of 100 ms or more could.
    assert batches == 40 and emptied <= 3, f"{emptied} slots emptied in {batches} steady batches"


@pytest.mark.timeout(120)
def test_a_stall_gives_the_waiting_slot_back():
    stall_batch = 10
    loader = loader_of(Paced(16 * BATCH, stall_at=stall_batch * BATCH, stall_s=1.5))
    emptied_before = None
    for k, x in enumerate(loader):
        assert int(x[0, 0, 0]) == (k * BATCH) % 256
        if k == stall_batch - 2:  # the task of batch `stall_batch` is in flight now
            emptied_before = loader._arena.emptied
        if k == stall_batch:
            # the consumer waited 1.5 s, about 75 of the worker's task times: the slot freed
            # before it (waiting for that worker's next batch) was emptied during the wait
            assert loader._arena.emptied > emptied_before
    loader.close()
