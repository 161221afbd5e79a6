"""The host cache: one byte-budgeted LRU per loader (``HostCache``), or one cache shared by the
ranks of a job on a host (``gpufeed.cache._shared``; docs/design/host-cache.md)."""

from gpufeed.cache._lru import (
    ROW_ALIGN,
    CachedValue,
    CacheSize,
    HostCache,
    aligned_copy,
    parse_cache_bytes,
)

__all__ = ["ROW_ALIGN", "CacheSize", "CachedValue", "HostCache", "aligned_copy", "parse_cache_bytes"]
