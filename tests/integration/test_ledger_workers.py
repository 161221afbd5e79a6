"""The slot ledger's iterator with a real worker process: a worker shutdown interrupted by Ctrl-C."""

from __future__ import annotations

import os

import pytest
import torch

from tests._procs import gpufeed_memfds


class IndexRows(torch.utils.data.Dataset):
    """32 samples: sample i is four floats equal to i."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open memfds in /proc/self/fd")
def test_an_iterator_whose_worker_shutdown_raised_still_lets_go_of_the_arena(monkeypatch):
    """A Ctrl-C that lands while the iterator joins its workers: the iterator must still detach
    from the arena, or closing the loader leaves the memfd open for the life of the process."""
    from gpufeed import FastLoader
    from gpufeed._engine.pool import WorkerPool

    before = set(gpufeed_memfds().items())
    shutdown = WorkerPool.shutdown

    def interrupted_shutdown(self: WorkerPool) -> object:
        shutdown(self)
        raise KeyboardInterrupt("Ctrl-C while the workers were joined")

    loader = FastLoader(IndexRows(), batch_size=4, num_workers=1)
    it = iter(loader)
    assert torch.equal(next(it)[0], torch.zeros(4))
    assert set(gpufeed_memfds().items()) - before  # the loader's arena (and a descriptor per mapped chunk)
    monkeypatch.setattr(WorkerPool, "shutdown", interrupted_shutdown)
    with pytest.raises(KeyboardInterrupt):
        it.close()
    monkeypatch.undo()
    loader.close()
    assert set(gpufeed_memfds().items()) - before == set()
