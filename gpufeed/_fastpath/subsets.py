"""``torch.utils.data.Subset`` over a gpufeed dataset on the fast paths.

``random_split`` returns Subsets, and so do the detection references (they drop the images
without annotations with one), so a loader over ``Subset(ImageFolder(...), ids)`` or
``Subset(CocoDetection(...), ids)`` takes the fast path of the gpufeed dataset underneath: the
parent maps each batch of the sampler's indices (positions in the Subset) to the base dataset's
indices once (:class:`SubsetIndex`) before the task is made, so the workers, the host cache,
the random draws (keyed by seed, epoch and the *base* index) and the error messages all see the
base dataset's indices; the workers read through the Subsets to the base
(``gpufeed.image._fill.base_source``).
Nested Subsets compose into one map. ``Subset(ds, range(len(ds)))`` gives ``ds``'s batches,
byte for byte; an index a Subset repeats draws alike, as an index a sampler repeats does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Subset

from gpufeed.errors import shorten
from gpufeed.image._fill import MAX_SUBSETS, base_source
from gpufeed.sources import ImageSource
from gpufeed.sources._detection import DetectionSource

__all__ = ["SubsetIndex", "SubsetMapped", "fast_dataset", "subset_index"]


def fast_dataset(dataset: Any) -> Any:
    """The gpufeed dataset (``ImageSource`` or ``DetectionSource``) a fast path reads for a
    loader over ``dataset``: ``dataset``, or the one under its Subsets; else ``dataset`` itself
    (which then takes the generic path)."""
    base = base_source(dataset)
    return base if isinstance(base, (ImageSource, DetectionSource)) else dataset


class SubsetIndex:
    """The map from a Subset's positions to its base dataset's indices (nested Subsets composed):
    ``subset_index(batch)`` is the batch of base indices, a list of ints."""

    __slots__ = ("indices",)

    def __init__(self, indices: np.ndarray) -> None:
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __call__(self, index: Sequence[int]) -> list[int]:
        try:
            return self.indices[np.asarray(index, dtype=np.int64)].tolist()
        except IndexError as exc:
            raise IndexError(f"the sampler gave index {shorten(index)} to a Subset of length "
                             f"{len(self.indices)}: {exc}. The sampler must give positions in "
                             f"the Subset, 0 to {len(self.indices) - 1}.") from exc


class SubsetMapped:
    """What a feed (the engine's ``FillPlugin``) adds to map its tasks' indices: ``index_map``
    set when the loader's dataset is a Subset of the feed's source."""

    index_map: SubsetIndex | None = None

    def task_index(self, index: list[int]) -> list[int]:
        """The base dataset's indices of a batch of the Subset's (``index_map``), else ``index``."""
        return index if self.index_map is None else self.index_map(index)


def _level(subset: Subset, size: int) -> np.ndarray:
    """One Subset's indices as an int64 array in [0, ``size``) (negative ones counted from the
    end, as ``dataset[i]`` does); ``IndexError``/``TypeError`` naming the value otherwise."""
    raw = subset.indices
    arr = np.asarray(raw if not isinstance(raw, range) else np.arange(raw.start, raw.stop, raw.step))
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"a Subset's `indices` must be a sequence of ints. Found: {shorten(raw)} "
                        f"({arr.dtype}, shape {arr.shape}).")
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < -size) | (arr >= size)
    if bad.any():
        value = int(arr[np.flatnonzero(bad)[0]])
        raise IndexError(f"a Subset's `indices` hold {value}, outside its dataset of {size} "
                         f"samples ({type(subset.dataset).__name__}). Give indices from "
                         f"{-size} to {size - 1}.")
    return np.where(arr < 0, arr + size, arr)


def subset_index(dataset: Any) -> SubsetIndex | None:
    """The :class:`SubsetIndex` of ``dataset`` when it is a (nested) Subset of a gpufeed dataset,
    else None (a plain dataset, or Subsets of another kind of dataset)."""
    chain: list[Subset] = []
    node = dataset
    while isinstance(node, Subset) and len(chain) < MAX_SUBSETS:
        chain.append(node)
        node = node.dataset
    if not chain or not isinstance(node, (ImageSource, DetectionSource)):
        return None
    indices: np.ndarray | None = None
    size = len(node)
    for subset in reversed(chain):  # innermost first: base indices of that Subset's positions
        level = _level(subset, size)
        indices = level if indices is None else indices[level]
        size = len(level)
    assert indices is not None  # the chain is not empty
    return SubsetIndex(indices)
