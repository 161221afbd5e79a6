"""HostCache: a byte-budgeted LRU (the parent's cache of decoded rows or encoded files)."""

from __future__ import annotations

from gpufeed import HostCache


def test_least_recently_used_values_go_first_to_fit_the_budget():
    cache = HostCache(10)
    cache.put(1, b"aaaa")
    cache.put(2, b"bbbb")
    assert cache.get(1) == b"aaaa"  # 1 is now the most recent
    cache.put(3, b"cccc")  # 12 bytes > 10: the least recent (2) goes
    assert cache.peek(2) is None and cache.peek(1) == b"aaaa" and cache.peek(3) == b"cccc"
    assert cache.nbytes == 8 and len(cache) == 2
    cache.put(1, b"a")  # a new value for a key replaces the old one's bytes
    assert cache.nbytes == 5
    cache.put(4, b"x" * 11)  # larger than the whole budget: not kept, nothing evicted
    assert cache.peek(4) is None and len(cache) == 2
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0


def test_get_many_counts_like_get_and_peeks_without_counting():
    cache = HostCache(12)
    for key in (1, 2, 3):
        cache.put(key, bytes([key]) * 4)
    assert cache.get_many([3, 9, 1]) == [b"\x03" * 4, None, b"\x01" * 4]
    assert (cache.hits, cache.misses) == (2, 1)
    cache.put(4, b"dddd")  # 2 is the least recently used: 1 and 3 were just looked up
    assert cache.peek(2) is None and cache.peek(1) is not None
    assert cache.get_many([2, 4], count=False) == [None, b"dddd"]
    assert (cache.hits, cache.misses) == (2, 1)  # peeks are not counted...
    cache.put(5, b"eeee")  # ...and do not refresh: 3 was the least recent, and it goes
    assert cache.peek(3) is None and cache.peek(4) == b"dddd"


def test_aligned_copies_are_cache_line_aligned_equal_and_sized_by_their_bytes():
    import numpy as np

    from gpufeed.cache import ROW_ALIGN, aligned_copy

    data = bytes(range(256)) * 3
    for src in (data, np.frombuffer(data, np.uint8).reshape(3, 256), memoryview(data)[1:]):
        row = aligned_copy(src)
        assert row.dtype == np.uint8 and row.ndim == 1 and row.ctypes.data % ROW_ALIGN == 0
        assert row.tobytes() == bytes(memoryview(src).cast("B"))
    cache = HostCache(2 * 768)
    cache.put(1, aligned_copy(data))
    cache.put(2, aligned_copy(data))
    assert cache.nbytes == 2 * 768  # a value weighs its bytes, as a bytes value does
    cache.put(3, aligned_copy(data))
    assert cache.peek(1) is None and cache.get_many([2, 3]) == [cache.peek(2), cache.peek(3)]
    assert cache.hits == 2
