"""SharedArray and PathTable: one read-only copy, a descriptor for workers, data for users."""

from __future__ import annotations

import gc
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from gpufeed.sources._paths import PathTable, labels_array
from gpufeed.sources._shared import MEMFD_NAME, SHARE_MIN_BYTES, SharedArray, share


def open_tables() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += MEMFD_NAME in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return count


def test_a_large_array_lives_in_one_sealed_read_only_file():
    before = open_tables()
    values = np.arange(SHARE_MIN_BYTES // 8 + 5, dtype=np.int64)
    arr = share(values)
    assert isinstance(arr, SharedArray) and arr.shared_fd is not None
    assert np.array_equal(arr, values) and not arr.flags.writeable
    assert open_tables() > before  # (Python's mmap holds a duplicate of the descriptor)
    with pytest.raises(PermissionError):  # sealed: not even the descriptor can write
        os.pwrite(arr.shared_fd, b"x", 0)
    handle = ForkingPickler.dumps(arr)
    data = pickle.dumps(arr)
    assert len(handle) < 1024 < arr.nbytes < len(data)
    for other in (pickle.loads(handle), pickle.loads(data)):
        assert np.array_equal(other, values) and other.shared_fd is not None
    del arr, other
    gc.collect()
    assert open_tables() == before


def test_small_and_empty_arrays_stay_private_and_results_are_plain():
    small = share(np.arange(10))
    empty = share(np.zeros(0, np.int64))
    assert small.shared_fd is None and empty.shared_fd is None and not small.flags.writeable
    assert len(ForkingPickler.dumps(small)) > small.nbytes  # by value
    big = labels_array(np.arange(SHARE_MIN_BYTES))
    assert type(big + 1) is np.ndarray and type(big.sum()) is np.int64
    assert type(big[3]) is np.int64
    with pytest.raises(TypeError, match="Python objects"):
        share(np.array([object()]))


def test_path_table_round_trips_any_file_system_name():
    names = ["a/b.jpg", "é/ü.JPEG", "raw\udcff.png", "", "x" * 300]
    table = PathTable(names)
    assert table.tolist() == names and len(table) == 5
    again = PathTable.from_arrays(table.blob, table.offsets)
    assert again.tolist() == names
    for blob, offsets in ((table.blob, table.offsets[:-1]),
                          (table.blob.astype(np.int64), table.offsets),
                          (table.blob, table.offsets[::-1].copy())):
        with pytest.raises(ValueError, match="not a path table"):
            PathTable.from_arrays(blob, offsets)
