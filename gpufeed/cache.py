"""The host-memory cache: one byte-budgeted LRU per loader, in the main process.

Workers never hold a cache of their own (N workers would mean N copies and N cold starts).
The parent looks samples up when it dispatches a batch and writes hits straight into the batch's
arena slot; workers only work on the misses, and the parent adds what they produced. What is
cached depends on the transform: the decoded, transformed row when the transform is
deterministic (evaluation, inference), the encoded bytes when it is random (training).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence

import psutil

from gpufeed.errors import shorten

CacheSize = int | str | None

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


class HostCache:
    """A byte-budgeted LRU of ``bytes`` values keyed by sample index; counts hits and misses.

    An ``OrderedDict`` in recency order (oldest first): a look-up is two C calls, which matters
    when a fully cached batch is served from here (64 look-ups per batch, next to 64 row copies).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lru: OrderedDict[int, bytes] = OrderedDict()
        self._nbytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: int) -> bytes | None:
        value = self._lru.get(key)
        if value is None:
            self.misses += 1
        else:
            self._lru.move_to_end(key)
            self.hits += 1
        return value

    def get_many(self, keys: Sequence[int], count: bool = True) -> list[bytes | None]:
        """The values of ``keys`` (None for a miss), in order. With ``count``, as ``get`` each
        (hits and misses counted, hits made most recent); without, as ``peek``."""
        lru = self._lru
        values = [lru.get(key) for key in keys]
        if count:
            found = 0
            touch = lru.move_to_end
            for key, value in zip(keys, values):
                if value is not None:
                    touch(key)
                    found += 1
            self.hits += found
            self.misses += len(values) - found
        return values

    def peek(self, key: int) -> bytes | None:
        """The value without counting a hit or refreshing its LRU position."""
        return self._lru.get(key)

    def put(self, key: int, value: bytes) -> None:
        """Add (or replace) ``key``; the least recently used values go until the total fits the
        budget. A value larger than the whole budget is not kept."""
        size = len(value)
        if size > self.budget_bytes:
            return
        lru = self._lru
        old = lru.pop(key, None)
        if old is not None:
            self._nbytes -= len(old)
        while lru and self._nbytes + size > self.budget_bytes:
            self._nbytes -= len(lru.popitem(last=False)[1])
        lru[key] = value
        self._nbytes += size

    @property
    def nbytes(self) -> int:
        """Bytes held now (never above ``budget_bytes``)."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        self._lru.clear()
        self._nbytes = 0
