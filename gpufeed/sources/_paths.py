"""Paths and labels in flat numpy arrays (no per-sample Python objects).

A forked worker shares its parent's memory copy-on-write; a list of a million ``str`` objects
is copied page by page as soon as workers touch their refcounts. One uint8 blob of file-system
encoded paths plus an int64 offset array is never written after construction, so it stays shared.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np


class PathTable:
    """An immutable sequence of paths stored as one byte blob and int64 offsets."""

    __slots__ = ("_blob", "_offsets")

    def __init__(self, paths: Iterable[str | os.PathLike]) -> None:
        encoded = [os.fsencode(p) for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        if encoded:
            np.cumsum([len(e) for e in encoded], out=offsets[1:])
        self._blob = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> str:
        start, end = self._offsets[index], self._offsets[index + 1]
        return os.fsdecode(self._blob[start:end].tobytes())

    def tolist(self) -> list[str]:
        """All paths as a list of ``str`` (builds Python objects: for inspection, not workers)."""
        return [self[i] for i in range(len(self))]

    @property
    def nbytes(self) -> int:
        """Memory held by the table, in bytes."""
        return int(self._blob.nbytes + self._offsets.nbytes)

    def __getstate__(self) -> tuple[np.ndarray, np.ndarray]:
        return self._blob, self._offsets

    def __setstate__(self, state: tuple[np.ndarray, np.ndarray]) -> None:
        self._blob, self._offsets = state


def labels_array(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    """Labels as a read-only int64 array."""
    arr = np.asarray(labels, dtype=np.int64).reshape(-1)
    arr.setflags(write=False)
    return arr
