"""Lazy mask planes over an array: what a COCO source's planes do, without decoding (tests of
the index maps against dense masks)."""

from __future__ import annotations

import numpy as np


class ArrayPlanes:
    """``LazyPlanes`` over an (N, H, W) array; counts its ``pixels`` calls and checks that
    every row and column asked for is in range."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.calls = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.data.shape  # type: ignore[return-value]

    def pixels(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        self.calls += 1
        assert rows.min() >= 0 and rows.max() < self.data.shape[1]  # the protocol: in range
        assert cols.min() >= 0 and cols.max() < self.data.shape[2]
        return self.data[:, rows[:, None], cols[None, :]]
