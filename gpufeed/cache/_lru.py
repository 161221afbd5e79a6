"""The host cache's byte-budgeted LRU and its budget parsing (see :mod:`gpufeed.cache`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import cachetools
import numpy as np
import psutil

from gpufeed.errors import shorten

CacheSize = int | str | None
CachedValue = bytes | np.ndarray  # bytes, or a 1-D uint8 array (``aligned_copy``)
ROW_ALIGN = 64  # bytes: a cache line

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}


def parse_cache_bytes(value: CacheSize) -> int:
    """Bytes from an int, a size string (``"2GB"``, ``"512MiB"``) or a share of available
    memory (``"60%"``). None or 0 means no cache."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError("`cache_bytes` must be an int, a size like '2GB', or a share like '60%'. "
                        f"Found: {shorten(value)}.")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"`cache_bytes` must be >= 0. Found: {value}.")
        return value
    if not isinstance(value, str):
        raise TypeError("`cache_bytes` must be an int, a size like '2GB', or a share like '60%'. "
                        f"Found: {shorten(value)}.")
    text = value.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 100:
            raise ValueError(f"`cache_bytes` as a share of available memory must be 0%..100%. Found: {shorten(value)}.")
        return int(psutil.virtual_memory().available * share / 100)
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([A-Za-z]*)", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(
            "`cache_bytes` must be an int, a size like '2GB' / '512MiB', or a share like '60%'. "
            f"Found: {shorten(value)}."
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def aligned_copy(data: Any) -> np.ndarray:
    """A copy of ``data`` (bytes-like or a contiguous array) as a 1-D uint8 array whose first
    byte is ``ROW_ALIGN``-aligned.

    The image path caches decoded rows this way: copying a cached row into a batch slot (also
    64-byte aligned per row) runs about 10% faster from an aligned source than from a ``bytes``
    object, whose data starts 16, 32 or 48 bytes into a cache line (measured with 150 KB rows,
    benchmarks/results/cache-epochs.md).
    """
    src = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    raw = np.empty(src.nbytes + ROW_ALIGN - 1, np.uint8)
    start = -raw.__array_interface__["data"][0] % ROW_ALIGN
    out = raw[start : start + src.nbytes]
    np.copyto(out, src)
    return out


class HostCache:
    """A byte-budgeted LRU (``cachetools.LRUCache``) of byte values keyed by sample index;
    counts hits and misses.

    Values are ``bytes`` or 1-D uint8 arrays (``aligned_copy``: the image path's decoded rows);
    a value's size is its length in bytes.
    """

    shared = False  # one loader's (``gpufeed.cache._shared.CacheNamespace``: the host's)

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lru: cachetools.LRUCache[int, CachedValue] = cachetools.LRUCache(maxsize=budget_bytes, getsizeof=len)
        self.hits = 0
        self.misses = 0

    def get(self, key: int) -> CachedValue | None:
        value = self._lru.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def get_many(self, keys: Sequence[int], count: bool = True) -> list[CachedValue | None]:
        """The values of ``keys`` (None for a miss), in order: one call per batch. With ``count``,
        as ``get`` each (hits and misses counted, hits made most recent); without, as ``peek``."""
        if not count:
            return [self.peek(key) for key in keys]
        values = [self._lru.get(key) for key in keys]  # about 0.45 us per key (64 keys: ~30 us)
        found = sum(1 for value in values if value is not None)
        self.hits += found
        self.misses += len(values) - found
        return values

    def peek(self, key: int) -> CachedValue | None:
        """The value without counting a hit or refreshing its LRU position."""
        try:
            return cachetools.Cache.__getitem__(self._lru, key)  # the base class: no LRU update
        except KeyError:
            return None

    def put(self, key: int, value: CachedValue) -> None:
        """Add (or replace) ``key``; the least recently used values go until the total fits the
        budget. A value larger than the whole budget is not kept."""
        if len(value) <= self.budget_bytes:  # cachetools raises for a value over the budget
            self._lru[key] = value

    def put_row(self, key: int, row: Any) -> None:
        """Cache a decoded row: an aligned copy (``aligned_copy``)."""
        self.put(key, aligned_copy(row))

    def put_rows(self, keys: Sequence[int], rows: Sequence[Any]) -> None:
        """Cache a batch's decoded rows: ``put_row`` each."""
        for key, row in zip(keys, rows, strict=True):
            self.put_row(key, row)

    def put_bytes(self, key: int, data: Any) -> None:
        """Cache encoded bytes: a ``bytes`` copy."""
        self.put(key, bytes(data))

    @property
    def nbytes(self) -> int:
        """Bytes held now (never above ``budget_bytes``)."""
        return int(self._lru.currsize)

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        self._lru.clear()
