"""RandomIoUCrop's draw, which tests all trial windows at once, makes the same windows and
leaves the generator where drawing the trials one by one (torchvision's loop) leaves it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpufeed.image.detection import Boxes, Sample
from gpufeed.image.detection._crops import RandomIoUCrop


def _iou(xyxy: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """IoU of each (N, 4) XYXY box with one box (torchvision's ``box_iou``)."""
    lt = np.maximum(xyxy[:, :2], box[:2])
    rb = np.minimum(xyxy[:, 2:], box[2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = (xyxy[:, 2] - xyxy[:, 0]) * (xyxy[:, 3] - xyxy[:, 1])
    return inter / (area + (box[2] - box[0]) * (box[3] - box[1]) - inter)


def one_by_one(op: RandomIoUCrop, rng: np.random.Generator, sample: Sample) -> Any:
    """torchvision's loop: one window per trial, tested before the next is drawn."""
    h, w = sample.size
    xyxy = np.array(sample.target["boxes"].data, np.float64)
    cx, cy = 0.5 * (xyxy[:, 0] + xyxy[:, 2]), 0.5 * (xyxy[:, 1] + xyxy[:, 3])
    options = op.sampler_options
    if len(xyxy) == 0 and max(options) < 1.0:
        return None
    while True:
        min_iou = options[int(rng.integers(len(options)))]
        if min_iou >= 1.0:
            return None
        for _ in range(op.trials):
            r = op.min_scale + (op.max_scale - op.min_scale) * rng.random(2)
            nw, nh = int(w * r[0]), int(h * r[1])
            if nh == 0 or not op.min_aspect_ratio <= nw / nh <= op.max_aspect_ratio:
                continue
            u = rng.random(2)
            left, top = int((w - nw) * u[0]), int((h - nh) * u[1])
            if nw == 0:
                continue
            inside = (left < cx) & (cx < left + nw) & (top < cy) & (cy < top + nh)
            if not inside.any() or _iou(xyxy[inside], (left, top, left + nw, top + nh)).max() < min_iou:
                continue
            return {"top": top, "left": left, "height": nh, "width": nw, "inside": inside}


def sample_with(n: int, seed: int, h: int = 90, w: int = 120) -> Sample:
    rng = np.random.default_rng(seed)
    xy = rng.uniform([0, 0], [w - 10, h - 10], size=(n, 2))
    xyxy = np.concatenate([xy, xy + rng.uniform(1, 60, size=(n, 2))], axis=1)
    return Sample(np.zeros((h, w, 3), np.uint8), {"boxes": Boxes(xyxy, "XYXY", (h, w), dtype="float64")})


@pytest.mark.parametrize("op", [
    RandomIoUCrop(), RandomIoUCrop(trials=3), RandomIoUCrop(sampler_options=[0.5, 0.7, 1.0]),
    RandomIoUCrop(min_scale=0.05, max_scale=0.2, min_aspect_ratio=0.2, max_aspect_ratio=5.0, trials=7),
], ids=repr)
@pytest.mark.parametrize("n", [0, 1, 6, 30])
def test_draws_as_one_by_one(op, n):
    for seed in range(40):
        sample = sample_with(n, seed)
        if n == 0 and max(op.sampler_options) < 1.0:
            assert op.draw(np.random.default_rng(seed), sample) is None
            continue
        got_rng, want_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        got, want = op.draw(got_rng, sample), one_by_one(op, want_rng, sample)
        assert (got is None) == (want is None)
        if got is not None:
            assert {k: v for k, v in got.items() if k != "inside"} == {k: v for k, v in want.items() if k != "inside"}
            np.testing.assert_array_equal(got["inside"], want["inside"])
        assert got_rng.random() == want_rng.random()  # the generator moved on by the same draws
