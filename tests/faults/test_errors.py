"""User-code exceptions keep their type and gain a note; timeouts name what was waited for."""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import time

import pytest
import torch

from gpufeed import FastLoader
from gpufeed.errors import LoaderTimeoutError
from tests.faults._datasets import BadSampleError, RaisesAt, Slow, SquareGrids

pytestmark = pytest.mark.timeout(60)


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def test_dataset_exception_keeps_type_and_names_worker_pid_indices():
    loader = FastLoader(RaisesAt(32, at=9), batch_size=4, num_workers=2)
    with pytest.raises(KeyError, match="sample 9 missing") as info:
        list(loader)
    notes = _notes(info.value)
    assert "worker 0" in notes and "pid" in notes
    assert "sample indices [8, 9, 10, 11]" in notes
    assert "RaisesAt" in notes or "__getitem__" in notes  # the worker's traceback


def test_exception_that_does_not_unpickle_is_rebuilt_with_its_type():
    loader = FastLoader(RaisesAt(32, at=2, exc="custom"), batch_size=4, num_workers=1)
    with pytest.raises(BadSampleError, match="cannot read /data/2.jpg"):
        list(loader)


def test_iteration_continues_after_a_worker_exception_like_torch():
    loader = FastLoader(RaisesAt(16, at=5), batch_size=4, num_workers=2)
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError):
        next(it)
    assert [b[0].tolist() for b in it] == [[8, 9, 10, 11], [12, 13, 14, 15]]


def _bad_collate(batch):
    raise TypeError("collate cannot handle this")


def test_collate_exception_reaches_user():
    loader = FastLoader(SquareGrids(8), batch_size=4, num_workers=1, collate_fn=_bad_collate)
    with pytest.raises(TypeError, match="collate cannot handle this") as info:
        next(iter(loader))
    assert "sample indices [0, 1, 2, 3]" in _notes(info.value)


def _bad_init(worker_id):
    raise RuntimeError(f"init failed in {worker_id}")


def test_worker_init_fn_exception_reaches_user_and_stops_workers():
    loader = FastLoader(SquareGrids(8), batch_size=4, num_workers=2, worker_init_fn=_bad_init)
    it = iter(loader)
    with pytest.raises(RuntimeError, match="init failed in") as info:
        next(it)
    assert "worker_init_fn" in _notes(info.value)
    assert it.worker_pids == []



class _InitFailsOnceArmed:
    """worker_init_fn: worker 0 fails once ``marker`` exists (a later epoch's workers)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, worker_id: int) -> None:
        if worker_id == 0 and os.path.exists(self.marker):
            raise RuntimeError("init failed")


def _until_both_wait(pool, arena, warm_before: int, timeout_s: float = 30.0) -> None:
    """Return once worker 0 has exited (its failure is in its pipe) and worker 1 has taken a
    warm slot and its result pipe is readable (a Claim is the first thing a worker sends after
    taking a warm slot), while the parent has not yet looked at either."""
    failed, claimer = pool._workers[0], pool._workers[1]
    deadline = time.monotonic() + timeout_s
    while not (mpc.wait([failed.process.sentinel], 0) and arena.warm_waiting() < warm_before
               and mpc.wait([claimer.results], 0)):
        assert time.monotonic() < deadline, f"premise: no failure and claim within {timeout_s} s"
        time.sleep(0.01)  # polling with a deadline; what the test exercises is decided above


def test_worker_init_fn_exception_strands_no_slot_another_worker_claimed(tmp_path):
    """The failure and another worker's claim of a warm slot arrive in one poll: the claim is
    still honoured (the slot is freed) although the failure is raised first."""
    marker = tmp_path / "armed"
    loader = FastLoader(SquareGrids(64), batch_size=4, num_workers=2, worker_init_fn=_InitFailsOnceArmed(str(marker)))
    for batch in loader:  # epoch 0 leaves warm slots in the pipe
        pass
    del batch
    arena = loader._arena
    warm_before = arena.warm_waiting()
    assert warm_before > 0
    marker.touch()
    it = iter(loader)
    _until_both_wait(it._engine._pool, arena, warm_before)  # both messages wait when the parent first looks
    with pytest.raises(RuntimeError, match="init failed"):
        next(it)
    assert it.worker_pids == []
    assert arena.free_slots() == arena.num_slots
    loader.close()

def test_timeout_names_batch_worker_and_option():
    loader = FastLoader(Slow(8, 2.0), batch_size=2, num_workers=1, timeout=0.3)
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds") as info:
        next(iter(loader))
    assert isinstance(info.value, LoaderTimeoutError)
    msg = str(info.value)
    assert "sample indices [0, 1]" in msg and "worker 0" in msg and "`timeout`" in msg


def test_batch_larger_than_slot_capacity_still_arrives():
    loader = FastLoader(SquareGrids(16), batch_size=8, num_workers=1, max_batch_bytes=1 << 16,
                        collate_fn=lambda b: torch.zeros(40_000))  # 160 kB > 64 kB slot
    loader.collate_fn = _big_collate
    batches = list(loader)
    assert all(b.shape == (40_000,) and b.sum() == 0 for b in batches)
    assert loader.stats()["overflow_bytes"] >= 2 * 160_000


def _big_collate(batch):
    return torch.zeros(40_000)
