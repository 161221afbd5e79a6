"""``DetectionPipeline``: the joint ops of a detection/segmentation pipeline, run on one sample
in a worker, and the output stage that turns the sample into what the torchvision pipeline
returns (tensors, or ``tv_tensors`` until a ``ToPureTensor``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpufeed.image.detection._as_given import has_rotated, torch_leaf, tv_module
from gpufeed.image.detection._sample import Boxes, JointOp, KeyPoints, Mask, Sample, map_leaves

__all__ = ["Alloc", "DetectionPipeline"]

#: ``alloc(shape, dtype)``: an empty tensor for an output (the worker gives one in its arena slot,
#: so the batch's transport copies nothing); None allocates with torch.
Alloc = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def _new(alloc: Alloc | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype) if alloc is None else alloc(shape, dtype)


def _is_rgb(img: np.ndarray) -> bool:
    """Whether ``img`` is a non-empty (H, W, 3) image, which the plane-wise conversions take."""
    return img.size > 0 and img.ndim == 3 and img.shape[2] == 3


def _planes_into(img: np.ndarray, chw: torch.Tensor, out: torch.Tensor, scale: bool = False) -> None:
    """``out.copy_(chw)`` (``chw``: the (H, W, 3) uint8 ``img`` seen as CHW) plane by plane:
    OpenCV splits the channels, then each plane converts contiguously. The same values; the
    strided copy reads across the whole image for every output row (measured, uint8 to float32:
    0.25 -> 0.12 ms at 256 x 256, 0.88 -> 0.62 ms at 560 x 560).

    ``scale``: then ``out.mul_(1 / 255)``, for a float32 or float64 ``out`` in the same pass
    (numpy multiplies in that dtype by the scale rounded to it: torch's values bit for bit;
    0.13 -> 0.10 ms at 256 x 256)."""
    if not _is_rgb(img):
        out.copy_(chw)
    else:
        import cv2

        planes = cv2.split(np.ascontiguousarray(img))
        if scale and out.dtype in (torch.float32, torch.float64):
            arr = out.numpy()
            factor = arr.dtype.type(1.0 / 255.0)
            for plane, part in zip(planes, arr, strict=True):
                np.multiply(plane, factor, out=part, dtype=arr.dtype)
            return
        for plane, part in zip(planes, out, strict=True):
            part.copy_(torch.from_numpy(plane))
    if scale:
        out.mul_(1.0 / 255.0)


def _normalize_(out: torch.Tensor, normalize: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    """torchvision's ``Normalize`` in place: ``out.sub_(mean).div_(std)`` per channel."""
    mean, std = (torch.tensor(v, dtype=out.dtype).view(-1, 1, 1) for v in normalize)
    out.sub_(mean).div_(std)


#: Output dtypes whose byte -> value table OpenCV's LUT can hold.
_TABLE_DTYPES = (torch.float32, torch.float64)


@functools.lru_cache(maxsize=32)
def _value_table(dtype: torch.dtype, scale: bool,
                 normalize: tuple[tuple[float, ...], tuple[float, ...]]) -> tuple[np.ndarray, ...]:
    """Per channel, the 256 values the general output path (``_planes_into`` then
    ``_normalize_``) gives each byte value: it runs on an image holding every byte once, and
    its ops are element-wise, so the table's values are those of any image, bit for bit."""
    every = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)  # (1, 256, 3)
    table = torch.empty((3, 1, 256), dtype=dtype)
    _planes_into(every, torch.from_numpy(every).permute(2, 0, 1), table, scale=scale)
    _normalize_(table, normalize)
    return tuple(np.ascontiguousarray(plane.reshape(256)) for plane in table.numpy())


def _table_into(img: np.ndarray, out: torch.Tensor, table: tuple[np.ndarray, ...]) -> None:
    """``out[c] = table[c][img[..., c]]``: the conversion and normalization in one pass over
    the output (against three: 0.72 -> 0.44 ms at 480 x 480, one thread, the output in cache)."""
    import cv2

    arr = out.numpy()
    for plane, part, values in zip(cv2.split(np.ascontiguousarray(img)), arr, table, strict=True):
        result = cv2.LUT(plane, values, dst=part)
        if result is not part:  # OpenCV allocated instead of writing in place
            np.copyto(part, result.reshape(part.shape))


@dataclass(frozen=True)
class DetectionPipeline:
    """Joint ops (``ops``) then the output stage.

    Output stage (torchvision's trailing ``ToImage``/``ToDtype``/``Normalize``/``ToPureTensor``):
    the image becomes a CHW tensor of ``image_dtype`` (float dtypes scaled to [0, 1] when
    ``scale``, as ``ToDtype(dtype, scale=True)``), normalized by ``normalize`` = (mean, std) if
    given; masks become ``mask_dtype`` (None: their own dtype). An image the ops left float (an op
    run as given returned one, e.g. a ``ToDtype`` followed by an op gpufeed runs as given) is
    not scaled again: it is cast to ``image_dtype`` when that is a float dtype, else kept.
    ``pure``: plain tensors (after ``ToPureTensor``); otherwise the boxes, masks and keypoints
    are ``tv_tensors`` (which imports torchvision), and the image too unless ``plain_image``
    (the pipeline converted it with ``PILToTensor``, which gives a plain tensor).
    ``fallback``: the ops to run instead of ``ops`` on a sample whose boxes are in a rotated
    format (each op as given, seeded); empty: always ``ops``.
    ``seed``: the seed of the joint ops' draws when the loader gives none (``seed=``).
    ``source``: the pipeline this was translated from, for ``repr``/``explain``.
    """

    ops: tuple[JointOp, ...] = ()
    image_dtype: torch.dtype = torch.float32
    scale: bool = True
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    mask_dtype: torch.dtype | None = None
    pure: bool = True
    plain_image: bool = False
    fallback: tuple[JointOp, ...] = ()
    seed: int | None = None
    source: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.image_dtype, torch.dtype) or not (
                self.image_dtype == torch.uint8 or self.image_dtype.is_floating_point):
            raise ValueError(f"`image_dtype` must be torch.uint8 or a float dtype. "
                             f"Found: {self.image_dtype!r}.")
        if self.normalize is not None:
            if not self.image_dtype.is_floating_point:
                raise ValueError(f"`normalize` needs a float `image_dtype`. Found: {self.image_dtype}.")
            if len(self.normalize) != 2 or 0.0 in tuple(self.normalize[1]):
                raise ValueError(f"`normalize` must be (mean, std) with non-zero stds. "
                                 f"Found: {self.normalize!r}.")
        if self.mask_dtype is not None and not isinstance(self.mask_dtype, torch.dtype):
            raise ValueError(f"`mask_dtype` must be a torch.dtype or None. Found: {self.mask_dtype!r}.")

    def run(self, sample: Sample, rng: np.random.Generator) -> Sample:
        """The joint ops, in order, on ``sample`` (parameters drawn from ``rng``); ``fallback``
        instead when the sample has boxes in a rotated format."""
        ops = self.fallback if self.fallback and has_rotated(sample) else self.ops
        for op in ops:
            sample = op(sample, rng)
        return sample

    def output(self, sample: Sample, alloc: Alloc | None = None) -> tuple[Any, Any]:
        """(image, target) as the torchvision pipeline returns them; the image is written into
        ``alloc``'s tensor."""
        img = sample.image
        h, w = img.shape[:2]
        chw = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)
        normalized = False
        if img.dtype != np.uint8:  # left float by an op as given: already converted
            dtype = self.image_dtype if self.image_dtype.is_floating_point else chw.dtype
            out = chw.to(dtype, copy=True)
            if alloc is not None:
                out = _new(alloc, tuple(out.shape), out.dtype).copy_(out)
        else:
            out = _new(alloc, (3, h, w), self.image_dtype)
            scale = self.image_dtype.is_floating_point and self.scale
            if self.normalize is not None and out.dtype in _TABLE_DTYPES and _is_rgb(img):
                # a value per byte and channel: converted and normalized in one pass
                key = (tuple(self.normalize[0]), tuple(self.normalize[1]))
                _table_into(img, out, _value_table(out.dtype, scale, key))
                normalized = True
            else:
                _planes_into(img, chw, out, scale=scale)
        if self.normalize is not None and out.dtype.is_floating_point and not normalized:
            _normalize_(out, self.normalize)
        target = map_leaves(sample.target, lambda leaf: self._leaf(leaf, alloc))
        if self.pure or self.plain_image:
            return out, target
        tv_tensors = tv_module()
        return tv_tensors.Image(out), target

    def _leaf(self, leaf: Any, alloc: Alloc | None) -> Any:
        if isinstance(leaf, Mask) and alloc is not None:
            # in the slot, so that stacking the batch's masks copies nothing (SlotWriter.stacked)
            dense = torch.from_numpy(np.ascontiguousarray(leaf.dense()))
            t = _new(alloc, tuple(dense.shape), self.mask_dtype or dense.dtype).copy_(dense)
            return t if self.pure else tv_module().Mask(t)
        if isinstance(leaf, (Boxes, Mask, KeyPoints)):
            return torch_leaf(leaf, None if self.pure else tv_module(), self.mask_dtype)
        if self.pure and isinstance(leaf, torch.Tensor) and type(leaf) is not torch.Tensor:
            return leaf.as_subclass(torch.Tensor)  # a tv_tensor left by an op as given
        return leaf

    def describe(self) -> Sequence[str]:
        """One line per op (``explain``): where it runs ("fast": a gpufeed joint op; "tensor (as
        given)": the torchvision op on ``tv_tensors``), then the output stage."""
        lines = [f"{getattr(op, 'where', 'fast')}: {op!r}" for op in self.ops]
        return [*lines, f"output: {self.output_text()}"]

    def output_text(self) -> str:
        """The output stage in words."""
        parts = [f"image {str(self.image_dtype).removeprefix('torch.')}"
                 + (" on the 0-1 scale" if self.scale and self.image_dtype.is_floating_point else "")]
        if self.normalize is not None:
            parts.append(f"normalized (mean={list(self.normalize[0])}, std={list(self.normalize[1])})")
        if self.mask_dtype is not None:
            parts.append(f"masks {str(self.mask_dtype).removeprefix('torch.')}")
        parts.append("plain tensors" if self.pure else
                     "plain image tensor, tv_tensors target" if self.plain_image else "tv_tensors")
        return ", ".join(parts)
