"""``DetectionPipeline``: the joint ops of a detection/segmentation pipeline, run on one sample
in a worker, and the output stage that turns the sample into what the torchvision pipeline
returns (tensors, or ``tv_tensors`` until a ``ToPureTensor``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpufeed.image.detection._sample import Boxes, JointOp, KeyPoints, Mask, Sample, map_leaves

__all__ = ["Alloc", "DetectionPipeline"]

#: ``alloc(shape, dtype)``: an empty tensor for an output (the worker gives one in its arena slot,
#: so the batch's transport copies nothing); None allocates with torch.
Alloc = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def _new(alloc: Alloc | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype) if alloc is None else alloc(shape, dtype)


@dataclass(frozen=True)
class DetectionPipeline:
    """Joint ops (``ops``) then the output stage.

    Output stage (torchvision's trailing ``ToImage``/``ToDtype``/``Normalize``/``ToPureTensor``):
    the image becomes a CHW tensor of ``image_dtype`` (float dtypes scaled to [0, 1] when
    ``scale``), normalized by ``normalize`` = (mean, std) if given; masks become ``mask_dtype``
    (None: their own dtype). ``pure``: plain tensors (after ``ToPureTensor``); otherwise the
    image, boxes, masks and keypoints are ``tv_tensors`` (which imports torchvision).
    ``seed``: the seed of the joint ops' draws when the loader gives none (``seed=``).
    ``source``: the pipeline this was translated from, for ``repr``/``explain``.
    """

    ops: tuple[JointOp, ...] = ()
    image_dtype: torch.dtype = torch.float32
    scale: bool = True
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    mask_dtype: torch.dtype | None = None
    pure: bool = True
    seed: int | None = None
    source: Any = field(default=None, compare=False, repr=False)

    def run(self, sample: Sample, rng: np.random.Generator) -> Sample:
        """The joint ops, in order, on ``sample`` (parameters drawn from ``rng``)."""
        for op in self.ops:
            sample = op(sample, rng)
        return sample

    def output(self, sample: Sample, alloc: Alloc | None = None) -> tuple[Any, Any]:
        """(image, target) as the torchvision pipeline returns them; the image is written into
        ``alloc``'s tensor."""
        img = sample.image
        h, w = img.shape[:2]
        out = _new(alloc, (3, h, w), self.image_dtype)
        chw = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)
        if self.image_dtype == torch.uint8:
            out.copy_(chw)
        else:
            out.copy_(chw)
            if self.scale:
                out.mul_(1.0 / 255.0)
            if self.normalize is not None:
                mean, std = (torch.tensor(v, dtype=self.image_dtype).view(-1, 1, 1) for v in self.normalize)
                out.sub_(mean).div_(std)
        target = map_leaves(sample.target, self._leaf)
        if self.pure:
            return out, target
        from torchvision import tv_tensors

        return tv_tensors.Image(out), target

    def _leaf(self, leaf: Any) -> Any:
        if isinstance(leaf, Boxes):
            t = torch.from_numpy(leaf.data.astype(leaf.dtype))
            if self.pure:
                return t
            from torchvision import tv_tensors

            return tv_tensors.BoundingBoxes(t, format=leaf.format, canvas_size=leaf.canvas,
                                            clamping_mode=leaf.clamping_mode)
        if isinstance(leaf, Mask):
            t = torch.from_numpy(np.ascontiguousarray(leaf.dense()))
            if self.mask_dtype is not None:
                t = t.to(self.mask_dtype)
            if self.pure:
                return t
            from torchvision import tv_tensors

            return tv_tensors.Mask(t)
        if isinstance(leaf, KeyPoints):
            t = torch.from_numpy(leaf.data.astype(leaf.dtype))
            if self.pure:
                return t
            from torchvision import tv_tensors

            return tv_tensors.KeyPoints(t, canvas_size=leaf.canvas)
        return leaf

    def describe(self) -> Sequence[str]:
        """One line per op (``explain``)."""
        return [repr(op) for op in self.ops]
