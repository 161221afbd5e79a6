"""Order and epochs: in_order, prefetch_factor, persistent workers, random state per worker, timeout.

A dataset that draws from ``random``, ``torch`` and ``numpy`` in ``__getitem__`` only gives the
same batches if every worker is seeded like torch's and sees the same samples in the same order.
"""

from __future__ import annotations

import gc

import pytest

from ._datasets import IndexDataset, RandomDataset, SampleDataset
from ._parity import assert_same_batches, check_parity, close, make_pair

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("prefetch_factor", [1, 2, 4])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_prefetch_factor(prefetch_factor, num_workers):
    check_parity(IndexDataset(17), num_workers=num_workers, batch_size=3, prefetch_factor=prefetch_factor,
                 shuffle=True, seed=prefetch_factor)


@pytest.mark.parametrize("prefetch_factor", [1, 4])
def test_prefetch_factor_random_dataset(prefetch_factor):
    check_parity(RandomDataset(14), num_workers=2, batch_size=3, prefetch_factor=prefetch_factor, shuffle=True)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_prefetch_factor_zero_fails_like_torch():
    # torch accepts prefetch_factor=0 at construction and refuses it when iterating; an engine
    # that silently yields an empty epoch would lose every sample.
    ours, theirs = make_pair(IndexDataset(6), num_workers=1, batch_size=2, prefetch_factor=0)
    with pytest.raises(Exception) as want:
        iter(theirs)
    want_type, want_msg = want.type, str(want.value)
    want = None
    gc.collect()  # torch's half-built iterator complains in __del__; let it do so here
    with pytest.raises(Exception) as got:
        iter(ours)
    assert (got.type, str(got.value)) == (want_type, want_msg)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_in_order_true_exact_order(num_workers):
    check_parity(IndexDataset(20), num_workers=num_workers, batch_size=3, in_order=True, shuffle=True, seed=11)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_in_order_false_same_multiset(num_workers):
    (batches,) = check_parity(IndexDataset(20), num_workers=num_workers, batch_size=3, in_order=False,
                              shuffle=True, seed=11)
    assert sorted(i for b in batches for i in b[0].tolist()) == list(range(20))


def test_in_order_false_slow_worker_multiset():
    check_parity(_SlowEven(12), num_workers=2, batch_size=1, in_order=False, prefetch_factor=2)


def test_in_order_true_with_slow_worker():
    check_parity(_SlowEven(12), num_workers=2, batch_size=1, in_order=True)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_random_dataset_fresh_workers_each_epoch(num_workers):
    # non-persistent: each epoch draws a new base seed from the loader's generator
    got = check_parity(RandomDataset(12), num_workers=num_workers, batch_size=4, shuffle=True, epochs=3, seed=5)
    assert got[0][0]["py"].tolist() != got[1][0]["py"].tolist()


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_persistent_workers_random_dataset(num_workers, shuffle):
    # persistent: one base seed, the workers' random streams continue from epoch to epoch
    got = check_parity(RandomDataset(10), num_workers=num_workers, batch_size=3, shuffle=shuffle, epochs=3,
                       persistent_workers=True, seed=21)
    assert got[0][0]["torch"].tolist() != got[1][0]["torch"].tolist()


def test_persistent_workers_batch_size_none():
    check_parity(RandomDataset(7), num_workers=2, batch_size=None, epochs=2, persistent_workers=True)


def test_persistent_workers_reuse_the_same_processes():
    ours, _ = make_pair(IndexDataset(8), num_workers=2, batch_size=2, persistent_workers=True)
    try:
        it = iter(ours)
        list(it)
        pids = it.worker_pids
        assert iter(ours) is it and list(it) and it.worker_pids == pids
    finally:
        close(ours)


@pytest.mark.parametrize("persistent", [False, True])
def test_epoch_abandoned_midway_then_next_epoch(persistent):
    """Break after two batches, then run a full epoch: the next epoch is torch's, random state
    included (the workers already computed the prefetched batches of the abandoned epoch)."""
    results = []
    for loader in make_pair(RandomDataset(18), num_workers=2, batch_size=2, shuffle=True,
                            persistent_workers=persistent, seed=8):
        try:
            it = iter(loader)
            first = [next(it), next(it)]
            second = list(loader)
            third = list(loader)
        finally:
            close(loader)
        results.append((first, second, third))
    (f1, s1, t1), (f2, s2, t2) = results
    assert_same_batches(f1, f2, "abandoned epoch")
    assert_same_batches(s1, s2, "next epoch")
    assert_same_batches(t1, t2, "third epoch")


@pytest.mark.parametrize("persistent", [False, True])
def test_timeout_with_fast_dataset(persistent):
    check_parity(RandomDataset(10), num_workers=2, batch_size=3, timeout=10.0, epochs=2,
                 persistent_workers=persistent)


def test_timeout_batch_size_none_and_in_order_false():
    check_parity(SampleDataset(9, "dict"), num_workers=2, batch_size=None, timeout=5, in_order=False)


class _SlowEven(IndexDataset):
    """Even samples take longer: worker 0 falls behind when batch_size=1 and 2 workers."""

    def __getitem__(self, i):
        import time

        if i % 2 == 0:
            time.sleep(0.02)
        return super().__getitem__(i)
