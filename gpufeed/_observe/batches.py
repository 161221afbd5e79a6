"""Batch arithmetic shared by tuning, serving and the benchmark harness: the samples of a collated
batch, and the doubling ladder of sizes tried or bucketed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def batch_size_of(batch: Any) -> int:
    """Number of samples in a collated batch: the leading dimension of its first tensor/array.

    Tuples, lists and dicts are searched depth-first; a list of plain values (collated strings)
    counts as its length; anything else with ``len()`` too; otherwise 1. Detection's
    ``tuple(zip(*samples))`` (fields of equal length, one of them the samples' target dicts)
    counts its samples, not the first image's channels.
    """
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    zipped = _zipped_samples(batch)
    if zipped is not None:
        return zipped
    if isinstance(batch, Mapping):
        return batch_size_of(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        if not batch:
            return 0
        first = batch[0]
        nested = getattr(first, "shape", None) is not None or isinstance(first, (Mapping, list, tuple))
        return batch_size_of(first) if nested else len(batch)  # e.g. a collated list of strings
    try:
        return len(batch)
    except TypeError:
        return 1


def doublings(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, then ``limit`` itself: e.g. 6 -> [1, 2, 4, 6] (``limit`` >= 1)."""
    steps = []
    n = 1
    while n < limit:
        steps.append(n)
        n *= 2
    steps.append(limit)
    return steps


def _zipped_samples(batch: Any) -> int | None:
    """n when ``batch`` is ``tuple(zip(*samples))`` of n (image, target dict) samples: two or more
    tuples or lists of n items, those of one of them all dicts (``default_collate`` gathers
    dicts into one dict of batched tensors, so it never gives a sequence of them per sample)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        return None
    if not all(isinstance(field, (tuple, list)) for field in batch):
        return None
    n = len(batch[0])
    if n == 0 or any(len(field) != n for field in batch):
        return None
    if any(all(isinstance(item, Mapping) for item in field) for field in batch):
        return n
    return None
