"""What a batch looks like: default collate/convert over every sample type, custom collate_fns.

Batches are compared exactly (container types, dtypes, shapes, strides, values) with torch's
DataLoader on the same dataset and seed.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from gpufeed import FastLoader

from ._datasets import (
    ALL_KINDS,
    COLLATABLE_KINDS,
    AllKindsDataset,
    CustomBatch,
    IndexDataset,
    NoneDataset,
    Point,
    SampleDataset,
    collate_custom_object,
    collate_identity,
    collate_keep_none,
    collate_list_of_tensors,
    collate_noncontiguous,
    collate_views,
    collate_zero_size,
    make_sample,
)
from ._parity import assert_same, check_parity, first_error, make_pair, run_epochs

pytestmark = pytest.mark.timeout(60)


KIND_GROUPS = {
    "tensors": [k for k in COLLATABLE_KINDS if k.startswith("tensor_")],
    "ndarrays": [k for k in COLLATABLE_KINDS if k.startswith(("ndarray_", "np_"))],
    "python": ["int", "float", "bool", "str", "bytes"],
    "containers": ["dict", "tuple", "list", "namedtuple", "nested"],
}


@pytest.mark.parametrize("group", list(KIND_GROUPS))
def test_default_collate(group):
    # one field per sample kind: a mismatch names the kind in its path, e.g. batch 0['tensor_bf16']
    (batches,) = check_parity(AllKindsDataset(9, tuple(KIND_GROUPS[group])), num_workers=1, batch_size=4)
    assert len(batches) == 3


def test_kind_groups_cover_every_collatable_kind():
    assert sorted(k for g in KIND_GROUPS.values() for k in g) == sorted(COLLATABLE_KINDS)


def test_default_collate_all_kinds_in_one_sample():
    kinds = tuple(COLLATABLE_KINDS)
    (batches,) = check_parity(AllKindsDataset(7, kinds), num_workers=2, batch_size=3, shuffle=True, seed=2)
    first = batches[0]
    assert isinstance(first["namedtuple"], Point) and isinstance(first["bytes"], list)
    assert first["tensor_bf16"].dtype == torch.bfloat16 and first["ndarray_f16"].dtype == torch.float16


@pytest.mark.parametrize("num_workers", [1, 2])
def test_default_convert_batch_size_none(num_workers):
    # batch_size=None: default_convert turns ndarrays into tensors and keeps everything else.
    kinds = tuple(COLLATABLE_KINDS)  # not "ndarray_reversed": as_tensor refuses negative strides
    (batches,) = check_parity(AllKindsDataset(5, kinds), num_workers=num_workers, batch_size=None)
    sample = batches[0]
    assert isinstance(sample["ndarray_transposed"], torch.Tensor)
    assert isinstance(sample["str"], str) and isinstance(sample["int"], int)


def test_identity_collate_keeps_numpy_and_python_objects():
    (batches,) = check_parity(AllKindsDataset(7), num_workers=2, batch_size=3, collate_fn=collate_identity)
    sample = batches[0][0]
    assert isinstance(sample["ndarray_f64"], np.ndarray) and isinstance(sample["np_scalar"], np.float32)
    assert isinstance(sample["namedtuple"], Point)


def test_identity_collate_batch_size_none():
    check_parity(AllKindsDataset(4), num_workers=1, batch_size=None, collate_fn=collate_identity)


def test_none_values_pass_through_default_convert():
    (batches,) = check_parity(NoneDataset(), num_workers=2, batch_size=None)
    assert batches[0]["missing"] is None and batches[0]["pair"] == [None, 0]


def test_none_values_with_custom_collate():
    (batches,) = check_parity(NoneDataset(), num_workers=2, batch_size=4, collate_fn=collate_keep_none)
    assert batches[0]["missing"] == [None] * 4


def test_none_values_make_default_collate_raise_like_torch():
    ours, theirs = make_pair(NoneDataset(), num_workers=1, batch_size=2)
    want, got = first_error(theirs), first_error(ours)
    assert got[0] is want[0] is TypeError
    # torch wraps the message ("Caught TypeError in DataLoader worker process 0 ..."); the
    # original message is in both.
    assert got[1] in want[1]


@pytest.mark.parametrize("batch_size", [2, None])
def test_negative_stride_ndarray_raises_like_torch(batch_size):
    # default_collate / default_convert cannot turn a negatively strided ndarray into a tensor.
    ours, theirs = make_pair(SampleDataset(4, "ndarray_reversed"), num_workers=1, batch_size=batch_size)
    want, got = first_error(theirs), first_error(ours)
    assert got[0] is want[0] is ValueError
    assert got[1] in want[1]


def test_custom_collate_returning_custom_object():
    (batches,) = check_parity(IndexDataset(10), num_workers=2, batch_size=4, collate_fn=collate_custom_object)
    assert all(isinstance(b, CustomBatch) for b in batches)
    assert batches[-1].indices == [8, 9] and batches[-1].note == "2 samples"


def test_custom_collate_returning_list_of_tensors():
    (batches,) = check_parity(IndexDataset(10), num_workers=2, batch_size=3, collate_fn=collate_list_of_tensors)
    assert [len(b) for b in batches] == [4, 4, 4, 2]


def test_custom_collate_returning_non_contiguous_tensors():
    (batches,) = check_parity(IndexDataset(10), num_workers=2, batch_size=4, collate_fn=collate_noncontiguous)
    assert not batches[0][0].is_contiguous() and batches[0][4].stride() == (0, 0)


def test_custom_collate_returning_zero_size_tensors():
    (batches,) = check_parity(IndexDataset(7), num_workers=2, batch_size=3, collate_fn=collate_zero_size)
    assert batches[0]["empty_2d"].shape == (3, 0, 3)


def test_custom_collate_returning_views_of_one_another():
    (batches,) = check_parity(IndexDataset(10), num_workers=2, batch_size=4, collate_fn=collate_views)
    assert batches[0]["stacked_flat"].shape == (16,)


def test_views_stay_aliased_like_torch():
    """Writing through one view is seen through the others, in both loaders alike."""
    ours, theirs = make_pair(IndexDataset(10), num_workers=1, batch_size=4, collate_fn=collate_views)
    got, want = run_epochs(ours, 1)[0], run_epochs(theirs, 1)[0]
    for g, w in zip(got, want):
        for batch in (g, w):
            batch["collated"][-1, 0, 0] = 1234.0  # -> collated_row[0, 0], collated_t[0, 0, -1]
            batch["stacked"][1, 1, 1] = -55.0  # -> stacked_tail[0], stacked_col, stacked_flat
        assert g["collated_row"][0, 0] == 1234.0 and g["collated_t"][0, 0, -1] == 1234.0
        assert g["stacked_tail"][0, 1, 1] == -55.0 and g["stacked_flat"][7] == -55.0
        assert_same(g, w)


def test_views_of_a_collated_tensor_share_its_storage_like_torch():
    """Which outputs share a storage, and at which offset, matches torch (as torch.save sees it)."""
    ours, theirs = make_pair(IndexDataset(10), num_workers=1, batch_size=4, collate_fn=collate_views)
    got, want = run_epochs(ours, 1)[0], run_epochs(theirs, 1)[0]

    def layout(batch):
        keys = sorted(batch)
        shared = {
            (a, b)
            for a, b in itertools.combinations(keys, 2)
            if batch[a].untyped_storage().data_ptr() == batch[b].untyped_storage().data_ptr()
        }
        return shared, {k: batch[k].storage_offset() for k in keys}

    for g, w in zip(got, want):
        assert layout(g) == layout(w)


def test_user_collate_calling_default_collate_matches():
    # A custom collate that post-processes default_collate's output (which gpufeed writes into the
    # arena slot): the slot must hold exactly what default_collate produced.
    check_parity(AllKindsDataset(6, tuple(COLLATABLE_KINDS)), num_workers=2, batch_size=4,
                 collate_fn=_collate_then_scale)


def _collate_then_scale(batch):
    out = default_collate(batch)
    out["tensor_f32"] = out["tensor_f32"] * 2
    return out


@pytest.mark.parametrize("kind", ["tensor_f32", "ndarray_transposed", "nested"])
def test_large_batches_overflowing_the_slot(kind):
    # gpufeed's smallest slot: the batch's payloads do not all fit and are pickled instead.
    ds = _Big(5, kind)
    ours = FastLoader(ds, batch_size=3, num_workers=2, max_batch_bytes=1 << 16)
    theirs = DataLoader(ds, batch_size=3, num_workers=2)
    got, want = run_epochs(ours, 2), run_epochs(theirs, 2)
    for g, w in zip(got, want):
        for a, b in zip(g, w, strict=True):
            assert_same(a, b)


class _Big(torch.utils.data.Dataset):
    def __init__(self, n, kind):
        self.n, self.kind = n, kind

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"big": torch.arange(12_000, dtype=torch.float32) + i, "small": make_sample(self.kind, i)}


def test_all_kinds_listed():
    # every kind make_sample knows is exercised somewhere above
    assert set(ALL_KINDS) - set(COLLATABLE_KINDS) == {"ndarray_reversed"}
