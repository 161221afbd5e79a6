"""The host-memory cache: one byte-budgeted LRU (cachetools) per loader, in the main process.

Workers never hold a cache of their own (N workers would mean N copies and N cold starts).
The parent looks samples up when it dispatches a batch and writes hits straight into the batch's
arena slot; workers only work on the misses, and the parent adds what they produced. What is
cached depends on the transform: the decoded, transformed row when the transform is
deterministic (evaluation, inference), the encoded bytes when it is random (training).

When the loader is one of several ranks of a job on a host, its cache is instead its namespace
of one cache that every loader of the job on the host shares, with one budget for the host
(``gpufeed.cache._shared``; docs/design/host-cache.md).
"""

from gpufeed.cache._lru import (
    ROW_ALIGN,
    CachedValue,
    CacheSize,
    HostCache,
    aligned_copy,
    parse_cache_bytes,
)

__all__ = ["CacheSize", "CachedValue", "HostCache", "ROW_ALIGN", "aligned_copy", "parse_cache_bytes"]
