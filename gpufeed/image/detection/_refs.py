"""Joint ops for the helpers of torchvision's references scripts (not torchvision classes; the
translation recognises them by class name and attributes): ``PadIfSmaller`` of
``references/segmentation/v2_extras.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gpufeed.errors import is_int
from gpufeed.image.detection._fills import check_fill, fill_for
from gpufeed.image.detection._sample import Boxes, JointOp, KeyPoints, Mask, Sample, map_leaves

__all__ = ["PadIfSmaller"]


def _image_fill(fill: Any) -> np.ndarray:
    """A fill for a uint8 (H, W, 3) image as torchvision's tensor pad casts it: one value or
    one per channel, converted to uint8 (truncating, as ``torch.tensor(fill, dtype=uint8)``)."""
    if fill is None:
        fill = 0
    values = np.asarray(fill, dtype=np.float64).reshape(-1)
    if values.size not in (1, 3):
        raise ValueError(f"an image fill must be one value or 3. Found: {fill!r}.")
    return np.broadcast_to(values.astype(np.uint8), (3,))


class PadIfSmaller(JointOp):
    """The references' ``PadIfSmaller(size, fill)``: pads the right and bottom of a sample
    smaller than ``size`` x ``size`` to at least that, with ``fill`` per type (torchvision's
    fill dict, e.g. ``{tv_tensors.Mask: 255, "others": 0}``). Boxes and keypoints keep their
    coordinates on the larger canvas; masks are padded with their own fill."""

    name = "PadIfSmaller"

    def __init__(self, size: int, fill: Any = 0) -> None:
        if not is_int(size) or size < 0:
            raise ValueError(f"`size` must be a non-negative int. Found: {size!r}.")
        self.size, self.fill = int(size), check_fill(fill)

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        h, w = sample.size
        right, bottom = max(self.size - w, 0), max(self.size - h, 0)
        return (right, bottom) if right or bottom else None

    def apply(self, sample: Sample, params: Any) -> Sample:
        right, bottom = params
        h, w = sample.size
        img = sample.image
        out = np.empty((h + bottom, w + right, img.shape[2]), dtype=img.dtype)
        out[:h, :w] = img
        fill = _image_fill(fill_for(self.fill, "Image"))
        out[h:, :] = fill
        out[:h, w:] = fill
        canvas = (h + bottom, w + right)
        mask_fill = fill_for(self.fill, "Mask")
        mask_fill = 0 if mask_fill is None else mask_fill
        if not isinstance(mask_fill, (int, float)):
            mask_fill = list(mask_fill)[0]

        def leaf(x: Any) -> Any:
            if isinstance(x, (Boxes, KeyPoints)):
                return dataclasses.replace(x, canvas=canvas)
            if isinstance(x, Mask):
                mh, mw = x.size
                m = dataclasses.replace(x)
                m.select(np.concatenate([np.arange(mh), np.full(bottom, -1)]),
                         np.concatenate([np.arange(mw), np.full(right, -1)]), fill=mask_fill)
                return m
            return x

        return Sample(out, map_leaves(sample.target, leaf))

    def __repr__(self) -> str:
        return f"PadIfSmaller(size={self.size}, fill={self.fill!r})"
