"""Shared pieces of the augmentation tests: photo-like rows, difference measures, and what
torchvision's containers run."""

from __future__ import annotations

import random

import numpy as np

from gpufeed.synth import photo_like

# point ops: mean absolute difference (grey levels); colour ops; geometry (resampling warps)
POINT, COLOUR, GEOMETRY = 1.0, 2.0, 3.0
# nearest-neighbour warps: share of pixels that differ, 1% (torchvision's tests allow 5% between
# its PIL and tensor affine warps, test_functional_tensor.py; ours reproduce PIL's 16.16 fixed
# point and differ in 0-0.2%). Hue: largest difference (torchvision allows 16.1 between its PIL
# and tensor adjust_hue).
NEAREST_SHARE, HUE_MAX = 0.01, 16.1


def rows(n: int = 4, seed: int = 0) -> list[np.ndarray]:
    """``n`` photo-like uint8 (H, W, 3) rows of a few sizes around 224."""
    sizes = ((224, 224), (200, 260), (257, 231), (180, 180), (240, 320))
    return [photo_like(*sizes[k % len(sizes)], seed=seed + k) for k in range(n)]


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def share_differing(a: np.ndarray, b: np.ndarray) -> float:
    """Share of pixels with any channel different."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a != b).any(axis=2).mean())


def max_abs(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def share_far(a: np.ndarray, b: np.ndarray, levels: int) -> float:
    """Share of pixels with a channel more than ``levels`` apart."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((np.abs(a.astype(np.int16) - b.astype(np.int16)) > levels).any(axis=2).mean())


class _Mark:
    """An op that records its index when torchvision's container runs it."""

    def __init__(self, index, seen):
        self.index, self.seen = index, seen

    def __call__(self, img):
        self.seen.append(self.index)
        return img


def run_container(make, k: int, n: int) -> list:
    """What torchvision's container ``make(ops)`` runs on each of ``n`` calls: the tuple of the
    indices of its ``k`` recording ops, in the order run (torch and random seeded with 0)."""
    import torch

    seen: list = []
    container = make([_Mark(i, seen) for i in range(k)])
    out = []
    random.seed(0)
    torch.manual_seed(0)
    for _ in range(n):
        seen.clear()
        container(torch.zeros(3, 2, 2))
        out.append(tuple(seen))
    return out
