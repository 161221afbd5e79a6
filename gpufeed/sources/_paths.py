"""Paths and labels in flat numpy arrays (no per-sample Python objects).

A forked worker shares its parent's memory copy-on-write; a list of a million ``str`` objects
is copied page by page as soon as workers touch their refcounts. One uint8 blob of file-system
encoded paths plus an int64 offset array is never written after construction, so it stays shared:
8 bytes per sample plus the path bytes, and 8 more for the label array.

Both live in :class:`~gpufeed.sources._shared.SharedArray` s: under ``spawn``/``forkserver`` a
worker receives a descriptor and maps the parent's pages read-only instead of unpickling a copy
(see ``gpufeed.sources._shared``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from gpufeed.sources._shared import SharedArray, share


class PathTable:
    """An immutable sequence of paths stored as one byte blob and int64 offsets."""

    __slots__ = ("_blob", "_offsets")

    def __init__(self, paths: Iterable[str | os.PathLike]) -> None:
        encoded = [os.fsencode(p) for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        if encoded:
            np.cumsum([len(e) for e in encoded], out=offsets[1:])
        self._blob = share(np.frombuffer(b"".join(encoded), dtype=np.uint8))
        self._offsets = share(offsets)

    @classmethod
    def from_arrays(cls, blob: np.ndarray, offsets: np.ndarray) -> PathTable:
        """A table over ``blob`` (uint8 path bytes) cut at ``offsets`` (int64, len + 1 entries,
        starting at 0, non-decreasing, ending at ``len(blob)``); both are copied."""
        offsets = np.asarray(offsets)
        blob = np.asarray(blob)
        if (blob.dtype != np.uint8 or blob.ndim != 1 or offsets.dtype != np.int64
                or offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0
                or offsets[-1] != len(blob) or bool(np.any(np.diff(offsets) < 0))):
            raise ValueError(f"not a path table: blob {blob.dtype}{blob.shape}, offsets "
                             f"{offsets.dtype}{offsets.shape} (want uint8 bytes and int64 "
                             f"offsets from 0 to len(blob), non-decreasing)")
        table = cls.__new__(cls)
        table._blob, table._offsets = share(blob), share(offsets)
        return table

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> str:
        start, end = self._offsets[index], self._offsets[index + 1]
        return os.fsdecode(self._blob[start:end].tobytes())

    def tolist(self) -> list[str]:
        """All paths as a list of ``str`` (builds Python objects: for inspection, not workers)."""
        return [self[i] for i in range(len(self))]

    @property
    def blob(self) -> np.ndarray:
        """The concatenated file-system encoded paths (uint8, read-only)."""
        return self._blob

    @property
    def offsets(self) -> np.ndarray:
        """Path ``i`` is ``blob[offsets[i]:offsets[i + 1]]`` (int64, read-only)."""
        return self._offsets

    @property
    def nbytes(self) -> int:
        """Memory held by the table, in bytes."""
        return int(self._blob.nbytes + self._offsets.nbytes)

    def __getstate__(self) -> tuple[SharedArray, SharedArray]:
        return self._blob, self._offsets

    def __setstate__(self, state: tuple[SharedArray, SharedArray]) -> None:
        self._blob, self._offsets = state


def labels_array(labels: Sequence[int] | np.ndarray) -> SharedArray:
    """Labels as a read-only int64 array (shared with spawned workers when large)."""
    return share(np.asarray(labels, dtype=np.int64).reshape(-1))
