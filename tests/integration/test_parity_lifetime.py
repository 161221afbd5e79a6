"""Batches are views of the loader's arena: they must stay valid while held, be independent of one
another, survive the loader, and behave like DataLoader's when two iterators run at once."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpufeed import FastLoader
from tests._procs import gpufeed_memfds, live_children

from ._datasets import COLLATABLE_KINDS, AllKindsDataset, IndexDataset, RandomDataset, collate_identity
from ._parity import assert_same, assert_same_batches, close, make_pair, run_epochs

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("prefetch_factor", [1, 2])
def test_held_batches_survive_later_epochs(persistent, prefetch_factor):
    """Keep every batch of epoch 0, run two more epochs (every slot is reused), then compare."""
    kwargs = dict(num_workers=2, batch_size=3, shuffle=True, persistent_workers=persistent,
                  prefetch_factor=prefetch_factor, seed=4)
    ours, theirs = make_pair(RandomDataset(15), **kwargs)
    want = run_epochs(theirs, 3)
    try:
        held = list(ours)
        later = [list(ours), list(ours)]
        assert_same_batches(later[0], want[1], "epoch 1")
        assert_same_batches(later[1], want[2], "epoch 2")
        del later
        gc.collect()
        list(ours)  # a fourth epoch into the freed slots
        assert_same_batches(held, want[0], "held epoch 0")
    finally:
        close(ours)


def test_held_batches_survive_close_and_loader_deletion():
    ours, theirs = make_pair(AllKindsDataset(8, tuple(COLLATABLE_KINDS)), num_workers=2, batch_size=3,
                             persistent_workers=True)
    want = run_epochs(theirs, 1)[0]
    held = list(ours)
    ours.close()
    del ours
    gc.collect()
    assert_same_batches(held, want)


def test_held_numpy_arrays_survive_later_epochs():
    ours, theirs = make_pair(AllKindsDataset(6), num_workers=1, batch_size=2, collate_fn=collate_identity,
                             prefetch_factor=1)
    want = run_epochs(theirs, 1)[0]
    held = list(ours)
    for _ in range(2):
        list(ours)
    close(ours)
    assert_same_batches(held, want)


@pytest.mark.parametrize("hold", [False, True])
def test_mutating_a_batch_does_not_leak_into_later_batches(hold):
    """Scribble over every batch as it arrives (then keep or drop it): later batches, whose slots
    may be the very ones just scribbled on, still equal DataLoader's."""
    ours, theirs = make_pair(RandomDataset(20), num_workers=2, batch_size=2, prefetch_factor=1)
    want = run_epochs(theirs, 2)
    kept = []
    try:
        for epoch in range(2):
            for i, batch in enumerate(ours):
                assert_same(batch, want[epoch][i], f"epoch {epoch} batch {i}")
                batch["torch"].fill_(-1.0)
                batch["randint"].add_(10_000)
                batch["np"].mul_(0)
                if hold:
                    kept.append(batch)
    finally:
        close(ours)
    for batch in kept:  # and the scribbles stayed where they were made
        assert batch["torch"].eq(-1.0).all() and batch["np"].eq(0).all()


def test_mutating_a_held_batch_leaves_the_other_held_batches_alone():
    ours, theirs = make_pair(IndexDataset(12), num_workers=2, batch_size=2)
    want = run_epochs(theirs, 1)[0]
    held = run_epochs(ours, 1)[0]
    held[2][1].zero_()
    held[2][0].fill_(-7)
    for i, (g, w) in enumerate(zip(held, want)):
        if i != 2:
            assert_same(g, w, f"batch {i}")
    assert held[2][1].eq(0).all() and held[2][0].eq(-7).all()


def test_batches_pickle_deepcopy_and_save_like_dataloaders():
    ours, theirs = make_pair(AllKindsDataset(4, tuple(COLLATABLE_KINDS)), num_workers=1, batch_size=2)
    got, want = run_epochs(ours, 1)[0], run_epochs(theirs, 1)[0]
    for g, w in zip(got, want):
        for key in w:  # per field: torch 2.13 cannot pickle a uint16 tensor, whoever made it
            for roundtrip in (_pickled, copy.deepcopy, _saved):
                assert _outcome(roundtrip, g[key]) == _outcome(roundtrip, w[key]), (key, roundtrip)
                try:
                    expected = roundtrip(w[key])
                except Exception:
                    continue
                assert_same(roundtrip(g[key]), expected, f"{roundtrip.__name__}({key})")


def _pickled(obj):
    return pickle.loads(pickle.dumps(obj))


def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _outcome(fn, obj):
    try:
        fn(obj)
    except Exception as exc:
        return type(exc).__name__
    return "ok"


@pytest.mark.parametrize("persistent", [False, True])
def test_two_iterators_alive_at_once(persistent):
    """zip(loader, loader): two iterators at once, as DataLoader does it (for persistent workers,
    DataLoader hands out one shared iterator, reset by the second iter())."""
    pairs = []
    for loader in make_pair(RandomDataset(12), num_workers=2, batch_size=2, shuffle=True,
                            persistent_workers=persistent, seed=6):
        try:
            pairs.append([list(p) for p in zip(loader, loader)])
            pairs.append(list(loader))  # and an ordinary epoch afterwards
        finally:
            close(loader)
    (zipped_ours, after_ours, zipped_theirs, after_theirs) = pairs
    assert len(zipped_ours) == len(zipped_theirs) > 0
    for i, (g, w) in enumerate(zip(zipped_ours, zipped_theirs)):
        assert_same(g, w, f"pair {i}")
    assert_same_batches(after_ours, after_theirs, "next epoch")


def test_two_loaders_on_one_dataset_interleaved():
    ds = RandomDataset(10)
    a, b = FastLoader(ds, num_workers=1, batch_size=2, generator=torch.Generator().manual_seed(1)), FastLoader(
        ds, num_workers=2, batch_size=3, generator=torch.Generator().manual_seed(2))
    got = list(zip(a, b))
    want = list(zip(DataLoader(ds, num_workers=1, batch_size=2, generator=torch.Generator().manual_seed(1)),
                    DataLoader(ds, num_workers=2, batch_size=3, generator=torch.Generator().manual_seed(2))))
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"pair {i}")


def test_iterating_a_temporary_loader():
    """``for batch in FastLoader(...)`` and ``next(iter(FastLoader(...)))``: nothing but the
    iterator keeps the loader alive."""
    ds = IndexDataset(9)
    seed = 3

    def make(cls):
        return cls(ds, num_workers=2, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(seed))

    got = [batch for batch in make(FastLoader)]
    want = [batch for batch in make(DataLoader)]
    assert_same_batches(got, want)
    assert_same(next(iter(make(FastLoader))), next(iter(make(DataLoader))))
    gc.collect()


@pytest.mark.parametrize("persistent", [False, True])
def test_a_dropped_loader_releases_its_workers_and_arena_without_the_garbage_collector(persistent):
    """A loader is freed by reference counting once dropped, with a persistent iterator too: its
    workers exit and its shared memory closes although the garbage collector never runs."""
    gc.collect()
    before = set(gpufeed_memfds())
    gc.disable()
    try:
        loader = FastLoader(IndexDataset(12), num_workers=2, batch_size=3, shuffle=True,
                            persistent_workers=persistent)
        for _ in range(2):
            assert len(list(loader)) == 4
        pids = [p.pid for p in live_children()]
        if persistent:  # its workers and arena wait for the next epoch
            assert pids and set(gpufeed_memfds()) > before
        del loader
        assert set(gpufeed_memfds()) == before
        deadline = time.monotonic() + 30  # the workers exit on their own; only wait for that
        while [c for c in live_children() if c.pid in pids]:
            assert time.monotonic() < deadline, f"workers {pids} outlived their loader"
            time.sleep(0.05)
    finally:
        gc.enable()


class RecordsLoads(Dataset):
    """Slow samples that leave a marker file per index loaded."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        Path(self.marker_dir, f"loaded-{i}").write_text("")
        time.sleep(0.05)
        return torch.tensor(i)


def test_break_skips_the_tasks_still_queued(tmp_path):
    """As torch's done_event: at shutdown a worker finishes its current batch, not its queue."""
    loader = FastLoader(RecordsLoads(str(tmp_path)), batch_size=4, num_workers=2, prefetch_factor=4)
    for _ in loader:
        break  # 9 tasks were dispatched (8, then 1 more for the batch handed out)
    loaded = len(list(tmp_path.glob("loaded-*")))
    # Each worker: at most the task it finished and the one it was running; 36 if all 9 ran.
    assert loaded <= 2 * 2 * 4, f"{loaded} samples loaded: queued tasks ran during shutdown"
