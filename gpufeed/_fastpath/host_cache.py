"""The host cache of a fast path's loader: its own LRU, or its namespace of the job's host cache
(``cache_scope``; docs/design/host-cache.md), named by a fingerprint of what it holds."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from gpufeed._engine.layout import align_up
from gpufeed.cache import HostCache
from gpufeed.cache._job import job_info, wants_host_cache
from gpufeed.cache._shared import CacheNamespace, SharedHostCache

log = logging.getLogger(__name__)


def source_parts(source: Any) -> list[str]:
    """A dataset's part of a cache fingerprint: its class, repr, length and 16 samples'
    ``describe`` (file paths), spread over it."""
    n = len(source)
    parts = [f"{type(source).__module__}.{type(source).__qualname__}", repr(source), str(n)]
    spread = np.unique(np.linspace(0, n - 1, 16).astype(np.int64)) if n else np.empty(0, np.int64)
    return parts + [source.describe(int(i)) for i in spread]


def make_host_cache(digest: Callable[[], bytes], num_samples: int, budget: int, text: str,
                    scope: str) -> HostCache | CacheNamespace | None:
    """``make_cache`` for any path: ``digest()`` (a fingerprint) names what the cached values
    are (the job's host cache keeps one namespace per fingerprint) for ``num_samples`` keys."""
    info = job_info()
    if not wants_host_cache(scope, info):
        return HostCache(budget)
    if info.key is None:
        raise ValueError(
            "`cache_scope='host'` shares one cache between the processes of a job, and no job was "
            "found: no GPUFEED_CACHE_JOB, TORCHELASTIC_RUN_ID, MASTER_ADDR/MASTER_PORT with "
            "WORLD_SIZE > 1, or initialised torch.distributed process group. Set GPUFEED_CACHE_JOB "
            "to the same string in every process of the job, or use cache_scope='auto'."
        )
    try:
        shared = SharedHostCache(info.key, budget, text)
    except (OSError, RuntimeError) as exc:  # TimeoutError is an OSError
        if scope == "host":
            raise
        log.warning("gpufeed: the job's host cache could not be reached (%s); this loader keeps a "
                    "cache of its own. cache_scope='rank' says so explicitly.", exc)
        return HostCache(budget)
    space = shared.namespace(digest(), num_samples)
    if space is None:
        shared.close()
        log.warning("gpufeed: the job's host cache has no room for this loader's table (%d samples, "
                    "budget %d bytes, or 56 kinds of rows already): it runs without a cache.",
                    num_samples, shared.budget_bytes)
    return space


def write_hits(buf: torch.Tensor, hits: Sequence[Any], start: int) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """Write the encoded values found (None: a miss) into ``buf`` (a slot, uint8) one after
    another from ``start``, each 64-byte aligned; returns ((position, offset, nbytes) of each,
    the end of the last)."""
    given, cursor = [], start
    for pos, hit in enumerate(hits):
        if hit is not None:
            buf[cursor:cursor + len(hit)].numpy()[:] = np.frombuffer(hit, np.uint8)
            given.append((pos, cursor, len(hit)))
            cursor = align_up(cursor + len(hit))
    return tuple(given), cursor


def put_staged(cache: HostCache | CacheNamespace, indices: Sequence[int],
               staged: Sequence[tuple[int, int, int]], buf: torch.Tensor) -> None:
    """Add the values a worker staged in ``buf`` ((position, offset, nbytes) each) to ``cache``
    under their samples' indices."""
    for pos, off, nbytes in staged:
        cache.put_bytes(indices[pos], buf[off:off + nbytes].numpy())
