"""Which samples form which batch: samplers, batch samplers, batch_size, drop_last, shuffle.

Each case runs torch's DataLoader and FastLoader with the same seed and compares every batch.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from gpufeed import FastLoader

from ._datasets import EveryOtherReversedSampler, IndexDataset, VariableBatchSampler
from ._parity import assert_same_batches, check_parity, make_pair, run_epochs

N = 23


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("batch_size", [1, 5, N + 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batch_size_drop_last_shuffle(num_workers, batch_size, drop_last, shuffle):
    (batches,) = check_parity(
        IndexDataset(N), num_workers=num_workers, batch_size=batch_size, drop_last=drop_last, shuffle=shuffle,
        seed=batch_size,
    )
    seen = sorted(i for b in batches for i in b[0].tolist())
    if not drop_last:
        assert seen == list(range(N))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_shuffle_differs_by_seed_like_torch(seed):
    check_parity(IndexDataset(N), num_workers=2, batch_size=3, shuffle=True, seed=seed, epochs=2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_custom_sampler(num_workers):
    ds = IndexDataset(N)
    check_parity(ds, num_workers=num_workers, batch_size=4, sampler=EveryOtherReversedSampler(N))


@pytest.mark.timeout(60)
def test_plain_iterable_as_sampler():
    check_parity(IndexDataset(N), num_workers=2, batch_size=3, sampler=[5, 3, 3, 0, 22, 1, 9])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("drop_last", [False, True])
def test_subset_random_sampler(drop_last):
    # SubsetRandomSampler draws from its own generator: one per loader, same seed.
    def make(seed=7):
        return SubsetRandomSampler([1, 4, 9, 16, 2, 3, 5, 7, 11], generator=torch.Generator().manual_seed(seed))

    ds = IndexDataset(N)
    kwargs = dict(num_workers=2, batch_size=4, drop_last=drop_last)
    ours, _ = make_pair(ds, sampler=make(), **kwargs)
    _, theirs = make_pair(ds, sampler=make(), **kwargs)
    assert len(ours) == len(theirs)
    got, want = run_epochs(ours, 2), run_epochs(theirs, 2)
    for g, w in zip(got, want):
        assert_same_batches(g, w)
    assert got[0][0][0].tolist() != got[1][0][0].tolist()  # a fresh permutation each epoch


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_random_sampler_with_generator(replacement):
    weights = [0.1, 5.0, 0.5, 2.0, 1.0, 0.0, 3.0, 0.7] + [0.2] * (N - 8)

    def make():
        return WeightedRandomSampler(weights, 15, replacement=replacement, generator=torch.Generator().manual_seed(3))

    ds = IndexDataset(N)
    ours, _ = make_pair(ds, sampler=make(), num_workers=2, batch_size=4)
    _, theirs = make_pair(ds, sampler=make(), num_workers=2, batch_size=4)
    assert len(ours) == len(theirs) == 4
    got, want = run_epochs(ours, 2), run_epochs(theirs, 2)
    for g, w in zip(got, want):
        assert_same_batches(g, w)


@pytest.mark.timeout(60)
def test_random_sampler_using_loader_generator():
    # RandomSampler built on the same generator object as the loader: the sampler's draws and the
    # workers' base seed interleave on one generator, in torch's order.
    ds = IndexDataset(N)
    loaders = []
    for cls in (FastLoader, DataLoader):
        g = torch.Generator().manual_seed(99)
        loaders.append(cls(ds, sampler=RandomSampler(ds, num_samples=30, replacement=True, generator=g),
                           generator=g, batch_size=4, num_workers=2))
    got, want = run_epochs(loaders[0], 3), run_epochs(loaders[1], 3)
    for g, w in zip(got, want):
        assert_same_batches(g, w)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_variable_size_batch_sampler(num_workers):
    (batches,) = check_parity(IndexDataset(N), num_workers=num_workers, batch_sampler=VariableBatchSampler(N, seed=5))
    assert [len(b[0]) for b in batches] == [1, 2, 3, 4, 5, 6, 2]


@pytest.mark.timeout(60)
def test_batch_sampler_object():
    sampler = BatchSampler(SequentialSampler(range(N)), batch_size=6, drop_last=True)
    check_parity(IndexDataset(N), num_workers=2, batch_sampler=sampler)


@pytest.mark.timeout(60)
def test_batch_sampler_as_list_of_lists():
    check_parity(IndexDataset(N), num_workers=2, batch_sampler=[[3, 1], [0], [22, 21, 20, 4], [5, 5, 5]])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batch_size_none(num_workers, shuffle):
    (batches,) = check_parity(IndexDataset(N), num_workers=num_workers, batch_size=None, shuffle=shuffle, seed=4)
    assert len(batches) == N
    assert isinstance(batches[0][0], int)  # default_convert leaves python numbers alone


@pytest.mark.timeout(60)
def test_batch_size_none_with_sampler():
    check_parity(IndexDataset(N), num_workers=2, batch_size=None, sampler=EveryOtherReversedSampler(N))


@pytest.mark.timeout(60)
def test_empty_dataset():
    check_parity(IndexDataset(0), num_workers=2, batch_size=3)
    check_parity(IndexDataset(0), num_workers=1, batch_size=None)


@pytest.mark.timeout(60)
def test_fewer_batches_than_workers_times_prefetch():
    check_parity(IndexDataset(3), num_workers=2, batch_size=2, prefetch_factor=4)
