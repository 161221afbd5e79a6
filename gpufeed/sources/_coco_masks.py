"""COCO segmentations (polygons, uncompressed or compressed RLE) as lazy mask planes.

Each annotation's segmentation becomes a compressed RLE at the source size with pycocotools,
exactly as torchvision's ``wrap_dataset_for_transforms_v2`` does for ``CocoDetection`` (a list
of polygons is rasterised and merged, an uncompressed RLE is compressed, a compressed one is
kept). :class:`CocoPlanes` then reads only the pixels a pipeline keeps: an RLE is a column-major
list of run lengths starting with a run of zeros, so the value at linear index ``col * H + row``
is the parity of the run it falls in, found by a binary search over the run boundaries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpufeed.errors import DecodeError, shorten

#: ``pixels`` binary-searches each selected pixel when they are fewer than 1/this of the pixels
#: of the columns they span, and expands those columns' runs otherwise.
_SPARSE_RATIO = 16

__all__ = ["CocoPlanes", "check_rle", "rle_counts", "rle_string", "segmentation_rle"]


def segmentation_rle(segmentation: Any, canvas: tuple[int, int]) -> dict[str, Any]:
    """The compressed RLE (pycocotools' dict) of one COCO ``segmentation`` on a ``canvas`` of
    (H, W): a list of polygons rasterised and merged, a dict with list ``counts`` compressed
    (at its own ``size``), a dict with string ``counts`` kept (as torchvision's wrapper does)."""
    from pycocotools import mask as mask_utils

    h, w = canvas
    if isinstance(segmentation, dict):
        check_rle(segmentation["counts"], segmentation["size"])
        if isinstance(segmentation["counts"], (str, bytes)):
            return segmentation
        return mask_utils.frPyObjects(segmentation, h, w)
    if isinstance(segmentation, list):
        _check_polygons(segmentation)
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w))
    raise ValueError(f"a COCO segmentation must be a dict (RLE) or a list (polygons). "
                     f"Found: {type(segmentation).__name__}.")


def _check_polygons(polygons: list[list[float]]) -> None:
    """Raise a DecodeError where pycocotools' ``frPyObjects`` would raise an error that names
    nothing (an empty list; a first polygon of 4 numbers or fewer, which it takes for a box or
    rejects) or never return (a coordinate that is NaN or infinite). Polygons it rasterises,
    however degenerate, pass: the masks stay torchvision's."""
    if not polygons:
        raise DecodeError("the segmentation is an empty list of polygons: a mask needs a polygon "
                          "of at least 3 points (6 numbers), or an RLE")
    if len(polygons[0]) <= 4:
        raise DecodeError(f"its first polygon has {len(polygons[0])} numbers: pycocotools needs "
                          f"at least 3 points (6 numbers) to rasterise a polygon")
    for polygon in polygons:
        if not math.isfinite(sum(polygon)):  # a NaN or infinity makes the sum one
            raise DecodeError(f"a polygon has a coordinate that is not a finite number "
                              f"({shorten(polygon)})")


def check_rle(counts: list[int] | str | bytes, size: Any) -> None:
    """Raise a DecodeError unless the run lengths ``counts`` (a list, or a compressed string)
    cover the ``size`` = [H, W] mask exactly: pycocotools fills a mask that a short RLE leaves
    unwritten with whatever memory held, and refuses a long one without saying why."""
    h, w = (int(v) for v in size)
    try:
        runs = np.asarray(counts, dtype=np.int64) if isinstance(counts, list) else rle_counts(counts)
    except (ValueError, OverflowError) as exc:
        raise DecodeError(f"its RLE counts cannot be read: {exc}") from None
    total = int(runs.sum())
    if (runs < 0).any() or total != h * w:
        raise DecodeError(f"its RLE's run lengths sum to {total} pixels (negative: "
                          f"{int((runs < 0).sum())}), but its size {h}x{w} has {h * w}")


def rle_counts(counts: str | bytes) -> np.ndarray:
    """The run lengths (int64) of a compressed RLE string (COCO's LEB128-like encoding: 5 bits
    a character offset by 48, 0x20 continues, 0x10 in the last character is the sign; counts
    after the second are stored as differences to the count two before)."""
    raw = counts.encode("ascii") if isinstance(counts, str) else bytes(counts)
    c = np.frombuffer(raw, dtype=np.uint8).astype(np.int64) - 48
    if c.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ((c < 0) | (c > 63)).any():
        raise ValueError(f"RLE counts string {raw[:40]!r} has characters outside '0' to 'o'")
    last = (c & 0x20) == 0  # the last character of each value
    if not last[-1]:
        raise ValueError(f"truncated RLE counts string {raw[:40]!r}")
    starts = np.flatnonzero(np.concatenate(([True], last[:-1])))
    group = np.cumsum(np.concatenate(([0], last[:-1].astype(np.int64))))
    shift = 5 * (np.arange(len(c)) - starts[group])
    values = np.add.reduceat((c & 0x1F) << shift, starts)
    tail_shift = shift[last] + 5
    negative = (c[last] & 0x10) != 0
    values[negative] |= np.left_shift(np.int64(-1), tail_shift[negative])
    out = values.copy()
    out[1::2] = np.cumsum(values[1::2])  # counts[m] += counts[m - 2] for m > 2
    out[2::2] = np.cumsum(values[2::2])
    return out


def rle_string(counts: list[int] | np.ndarray) -> bytes:
    """The compressed RLE string of run lengths ``counts`` (the inverse of :func:`rle_counts`;
    pycocotools' encoding)."""
    values = np.asarray(counts, dtype=np.int64).copy()
    values[3::2] -= np.asarray(counts, dtype=np.int64)[1:-2:2]  # differences to m - 2, m > 2
    values[4::2] -= np.asarray(counts, dtype=np.int64)[2:-2:2]
    out = bytearray()
    for x in values.tolist():
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = not ((c & 0x10) == 0 and x == 0 or (c & 0x10) != 0 and x == -1)
            out.append((c | 0x20 if more else c) + 48)
    return bytes(out)


class CocoPlanes:
    """:class:`~gpufeed.image.detection.LazyPlanes` over compressed RLEs (pycocotools dicts) of
    one (H, W) size: ``pixels(rows, cols)`` decodes only the selected pixels (the whole mask
    with pycocotools only when every pixel is selected)."""

    __slots__ = ("_bounds", "_rles", "_shape")

    def __init__(self, rles: list[dict[str, Any]], size: tuple[int, int]) -> None:
        h, w = int(size[0]), int(size[1])
        for rle in rles:
            got = tuple(int(v) for v in rle["size"])
            if got != (h, w):
                raise DecodeError(f"an RLE segmentation of size {got[0]}x{got[1]} (HxW) is on an "
                                 f"image of {h}x{w}: every mask must have the image's size.")
        self._rles = rles
        self._shape = (len(rles), h, w)
        self._bounds: list[np.ndarray | None] = [None] * len(rles)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self._shape

    @property
    def rles(self) -> list[dict[str, Any]]:
        """The compressed RLEs, one per plane."""
        return self._rles

    def _run_ends(self, k: int) -> np.ndarray:
        bounds = self._bounds[k]
        if bounds is None:
            bounds = np.cumsum(rle_counts(self._rles[k]["counts"]))
            self._bounds[k] = bounds
        return bounds

    def pixels(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """(N, len(rows), len(cols)) uint8: the planes at source ``rows`` and ``cols``."""
        n, h, w = self._shape
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        if n == 0:
            return np.zeros((0, len(rows), len(cols)), dtype=np.uint8)
        if (len(rows) == h and len(cols) == w and np.array_equal(rows, np.arange(h))
                and np.array_equal(cols, np.arange(w))):
            from pycocotools import mask as mask_utils

            full = mask_utils.decode(self._rles)  # (H, W, N), Fortran order
            return np.ascontiguousarray(full.transpose(2, 0, 1))
        out = np.empty((n, len(rows), len(cols)), dtype=np.uint8)
        if len(rows) == 0 or len(cols) == 0:
            return out
        c0, c1 = int(cols.min()), int(cols.max()) + 1
        if len(rows) * len(cols) * _SPARSE_RATIO < (c1 - c0) * h:
            # few pixels: the run of each one, by binary search on the run ends
            linear = cols[None, :] * h + rows[:, None]  # column-major index of each output pixel
            for k in range(n):
                run = np.searchsorted(self._run_ends(k), linear, side="right")
                np.bitwise_and(run, 1, out=out[k], casting="unsafe")
            return out
        # most pixels of the columns c0..c1 - 1: expand those columns' runs, then gather
        for k in range(n):
            span = self._columns(k, c0, c1).reshape(c1 - c0, h)
            out[k] = span.take(cols - c0, axis=0).take(rows, axis=1).T
        return out

    def _columns(self, k: int, c0: int, c1: int) -> np.ndarray:
        """Plane ``k``'s columns ``c0`` to ``c1 - 1``, column after column (uint8)."""
        h = self._shape[1]
        ends = self._run_ends(k)
        lo, hi = c0 * h, c1 * h
        first = int(np.searchsorted(ends, lo, side="right"))
        last = min(int(np.searchsorted(ends, hi - 1, side="right")), len(ends) - 1)
        if first > last:  # past the last run (a short RLE): zeros
            return np.zeros(hi - lo, dtype=np.uint8)
        run_ends = np.minimum(ends[first:last + 1], hi)
        run_starts = np.maximum(np.concatenate(([ends[first - 1] if first else 0],
                                                ends[first:last])), lo)
        values = (np.arange(first, last + 1) & 1).astype(np.uint8)
        dense = np.repeat(values, np.maximum(run_ends - run_starts, 0))
        if len(dense) < hi - lo:
            dense = np.concatenate((dense, np.zeros(hi - lo - len(dense), dtype=np.uint8)))
        return dense

    def __repr__(self) -> str:
        n, h, w = self._shape
        return f"CocoPlanes({n} planes, {h}x{w})"
