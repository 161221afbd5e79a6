"""Worker death: detected, replaced, its batches re-run; every sample exactly once, in order."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch.utils.data import DataLoader

from gpufeed import FastLoader
from gpufeed.errors import WorkerError
from tests.faults._datasets import AlwaysDies, DiesOnce, SquareGrids, StreamThatDies

pytestmark = pytest.mark.timeout(60)


def _reference(n: int, **kw):
    return list(DataLoader(SquareGrids(n), **kw))


def _assert_same(got, want) -> None:
    assert len(got) == len(want)
    for (gi, gx), (wi, wx) in zip(got, want):
        assert torch.equal(gi, wi)
        assert torch.equal(gx, wx)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_worker_that_dies_mid_epoch_is_replaced_and_batches_rerun(tmp_path, sig):
    ds = DiesOnce(64, at=(20,), marker_dir=str(tmp_path), sig=sig)
    loader = FastLoader(ds, batch_size=4, num_workers=2)
    got = list(loader)
    _assert_same(got, _reference(64, batch_size=4))
    assert loader.stats()["worker_restarts"] == 1


def test_several_deaths_in_one_epoch_exactly_once_in_order(tmp_path):
    ds = DiesOnce(96, at=(5, 30, 31, 70), marker_dir=str(tmp_path))
    loader = FastLoader(ds, batch_size=4, num_workers=2, shuffle=True,
                        generator=torch.Generator().manual_seed(3), max_worker_restarts=4)
    got = list(loader)
    want = list(DataLoader(SquareGrids(96), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)))
    _assert_same(got, want)
    seen = torch.cat([i for i, _ in got]).tolist()
    assert sorted(seen) == list(range(96))  # nothing lost, nothing duplicated
    assert loader.stats()["worker_restarts"] == 4


def test_worker_killed_from_outside_while_consumer_holds_batches():
    loader = FastLoader(SquareGrids(200), batch_size=5, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    got = []
    for k, batch in enumerate(it):
        got.append(batch)
        if k in (3, 17):
            os.kill(it.worker_pids[k % 2], signal.SIGKILL)
    _assert_same(got, _reference(200, batch_size=5))
    assert it.worker_restarts == 2


def test_restart_limit_raises_naming_pid_signal_and_batch():
    loader = FastLoader(AlwaysDies(32), batch_size=4, num_workers=2, max_worker_restarts=2)
    with pytest.raises(WorkerError) as info:
        list(loader)
    msg = str(info.value)
    assert "killed by SIGKILL" in msg
    assert "pid" in msg and "max_worker_restarts=2" in msg
    assert "indices [4, 5, 6, 7]" in msg


def test_iterable_worker_death_raises_at_once():
    loader = FastLoader(StreamThatDies(), batch_size=2, num_workers=1)
    with pytest.raises(WorkerError, match="IterableDataset.*cannot be replayed"):
        list(loader)


def test_persistent_workers_survive_a_death_across_epochs(tmp_path):
    ds = DiesOnce(40, at=(9,), marker_dir=str(tmp_path))
    loader = FastLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    want = _reference(40, batch_size=4)
    for _ in range(3):
        _assert_same(list(loader), want)
    loader.close()
