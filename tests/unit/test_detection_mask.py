"""``Mask``'s index maps (``gpufeed.image.detection._sample``): chains of selections, with and
without padding, dense and lazy, read the same pixels as a pixel-by-pixel reference."""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.image.detection import Mask
from tests.unit._planes import ArrayPlanes as _Lazy


def _reference(src: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill: int) -> np.ndarray:
    out = np.full((src.shape[0], len(rows), len(cols)), fill, src.dtype)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            if r >= 0 and c >= 0:
                out[:, i, j] = src[:, r, c]
    return out


@pytest.mark.parametrize("kind", ["planes", "plane", "lazy"])
@pytest.mark.parametrize("padded", [False, True])
def test_selection_chains_read_the_selected_pixels(kind, padded):
    rng = np.random.default_rng(7)
    for _ in range(60):
        n, h, w = (1 if kind == "plane" else int(rng.integers(1, 4))), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        src = rng.integers(0, 5, (n, h, w)).astype(np.uint8)
        mask = (Mask(lazy=_Lazy(src)) if kind == "lazy"
                else Mask(data=src.copy() if kind == "planes" else src[0].copy()))
        rows, cols = np.arange(h), np.arange(w)
        for _ in range(3):
            low = -1 if padded else 0
            r = rng.integers(low, len(rows), int(rng.integers(1, 10))) if rng.random() < 0.8 else None
            c = rng.integers(low, len(cols), int(rng.integers(1, 10))) if rng.random() < 0.8 else None
            mask.select(r, c, fill=3)
            rows = rows if r is None else np.where(r < 0, -1, rows[np.clip(r, 0, None)])
            cols = cols if c is None else np.where(c < 0, -1, cols[np.clip(c, 0, None)])
            want = _reference(src, rows, cols, 3)
            got = mask.dense()
            np.testing.assert_array_equal(got, want if kind != "plane" else want[0])


def test_no_pending_map_returns_the_data():
    data = np.ones((2, 3, 4), np.uint8)
    assert Mask(data=data).dense() is data
