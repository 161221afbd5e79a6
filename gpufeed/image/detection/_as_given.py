"""``AsGiven``: a torchvision (or user) op of a detection pipeline run as given on
``tv_tensors``, seeded from the sample's generator, for the ops gpufeed has no joint op for.

The sample goes to torchvision's types (:func:`to_torchvision`), the op runs with torch's and
Python's generators seeded from the sample's ``rng`` (their states are restored afterwards),
and the result comes back to the sample's numpy leaves (:func:`from_torchvision`). An op that
returns a float image leaves a float (H, W, 3) image in the sample: the output stage then casts
it to the pipeline's float dtype without scaling (``DetectionPipeline.output``).
"""

from __future__ import annotations

import importlib
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from gpufeed.image.detection._sample import Boxes, JointOp, KeyPoints, Mask, Sample, map_leaves

__all__ = ["IMAGE_KINDS", "ROTATED_FORMATS", "AsGiven", "from_torchvision", "has_rotated",
           "seeded", "to_torchvision", "torch_leaf", "tv_module"]

#: What an op as given receives as the image: "image" a ``tv_tensors.Image`` (after ``ToImage``),
#: "tensor" a plain CHW tensor (after ``PILToTensor``), "pil" a PIL image (before the conversion).
IMAGE_KINDS = ("image", "tensor", "pil")
#: torchvision's rotated box formats: a sample with such boxes runs every op as given.
ROTATED_FORMATS = frozenset({"XYWHR", "CXCYWHR", "XYXYXYXY"})


def tv_module() -> Any:
    """``torchvision.tv_tensors`` (imported when first needed)."""
    return importlib.import_module("torchvision.tv_tensors")


#: the generators are global: one seeded block at a time per process (threads wait)
_SEEDED = threading.RLock()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's (CPU) and Python's ``random`` generators seeded with ``seed`` inside the block,
    as ``torch.manual_seed(seed); random.seed(seed)`` would; their states restored after.
    Threads of a process take turns (the generators are global)."""
    with _SEEDED:
        torch_state, py_state = torch.get_rng_state(), random.getstate()
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            torch.set_rng_state(torch_state)
            random.setstate(py_state)


def torch_leaf(leaf: Any, tv: Any = None, mask_dtype: torch.dtype | None = None) -> Any:
    """A ``Boxes``/``Mask``/``KeyPoints`` leaf as a tensor in its dtype (a mask's output pixels,
    in ``mask_dtype`` if given): ``tv``'s (``torchvision.tv_tensors``) ``BoundingBoxes``/``Mask``/
    ``KeyPoints``, or a plain tensor where ``tv`` is None; other leaves as they are."""
    if isinstance(leaf, Boxes):
        t = torch.from_numpy(leaf.data.astype(leaf.dtype))
        return t if tv is None else tv.BoundingBoxes(t, format=leaf.format, canvas_size=tuple(leaf.canvas),
                                                     clamping_mode=leaf.clamping_mode)
    if isinstance(leaf, Mask):
        t = torch.from_numpy(np.ascontiguousarray(leaf.dense()))
        if mask_dtype is not None:
            t = t.to(mask_dtype)
        return t if tv is None else tv.Mask(t)
    if isinstance(leaf, KeyPoints):
        t = torch.from_numpy(leaf.data.astype(leaf.dtype))
        return t if tv is None else tv.KeyPoints(t, canvas_size=tuple(leaf.canvas))
    return leaf


def to_torchvision(sample: Sample, kind: str = "image") -> tuple[Any, Any]:
    """(image, target) in torchvision's types: the image as ``kind`` says (``IMAGE_KINDS``; a
    float image stays float), ``Boxes`` -> ``BoundingBoxes``, ``Mask`` -> ``Mask`` (its output
    pixels), ``KeyPoints`` -> ``KeyPoints``; other leaves as they are."""
    tv = tv_module()
    img = sample.image
    if kind == "pil":
        if img.dtype != np.uint8:
            raise ValueError(f"an op given a PIL image needs a uint8 image. Found: {img.dtype}.")
        from PIL import Image

        image: Any = Image.fromarray(np.ascontiguousarray(img))
    else:
        chw = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).contiguous()
        image = tv.Image(chw) if kind == "image" else chw

    return image, map_leaves(sample.target, lambda x: torch_leaf(x, tv))


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def from_torchvision(image: Any, target: Any) -> Sample:
    """The sample of torchvision's (image, target): the image (PIL, or a 3-channel CHW tensor)
    as (H, W, 3) numpy, leaves back to ``Boxes``/``Mask``/``KeyPoints`` (boxes in a rotated
    format stay ``BoundingBoxes``); other leaves as they are."""
    tv = tv_module()
    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(f"an op as given must return a (3, H, W) image. Found: shape "
                             f"{tuple(image.shape)}.")
        array = image.as_subclass(torch.Tensor).permute(1, 2, 0).contiguous().numpy()
    else:
        if getattr(image, "mode", None) is None:
            raise TypeError(f"an op as given must return a PIL image or a tensor image. Found: "
                            f"{type(image).__name__}.")
        array = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))

    def leaf(x: Any) -> Any:
        if isinstance(x, tv.BoundingBoxes):
            fmt = x.format.name
            if fmt in ROTATED_FORMATS:
                return x
            return Boxes(x.as_subclass(torch.Tensor).double().numpy(), format=fmt,
                         canvas=tuple(x.canvas_size), clamping_mode=x.clamping_mode,
                         dtype=_dtype_name(x))
        if isinstance(x, tv.Mask):
            return Mask(data=x.as_subclass(torch.Tensor).numpy())
        if isinstance(x, tv.KeyPoints):
            return KeyPoints(x.as_subclass(torch.Tensor).double().numpy(),
                             canvas=tuple(x.canvas_size), dtype=_dtype_name(x))
        return x

    return Sample(array, map_leaves(target, leaf))


def has_rotated(sample: Sample) -> bool:
    """True when a leaf of the target holds boxes in a rotated format (a ``BoundingBoxes``
    tensor the joint ops do not transform)."""
    for x in sample.leaves():
        fmt = getattr(getattr(x, "format", None), "name", None)
        if isinstance(x, torch.Tensor) and fmt in ROTATED_FORMATS:
            return True
    return False


class AsGiven(JointOp):
    """Runs ``op`` (a callable taking and returning (image, target)) as given on torchvision's
    types, with torch's and Python's generators seeded from the sample's generator (one 63-bit
    seed per sample). ``kind``: what the op receives as the image (``IMAGE_KINDS``)."""

    where = "tensor (as given)"

    def __init__(self, op: Any, kind: str = "image") -> None:
        if not callable(op):
            raise TypeError(f"`op` must be a callable taking (image, target). Found: "
                            f"{type(op).__name__}.")
        if kind not in IMAGE_KINDS:
            raise ValueError(f"`kind` must be one of {', '.join(IMAGE_KINDS)}. Found: {kind!r}.")
        self.op, self.kind = op, kind
        self.name = type(op).__name__
        if kind == "pil":
            self.where = "pil (as given)"

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return int(rng.integers(0, 2**63 - 1))

    def apply(self, sample: Sample, params: Any) -> Sample:
        image, target = to_torchvision(sample, self.kind)
        with seeded(int(params)):
            out = self.op(image, target)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"{self.name} must return (image, target). Found: {type(out).__name__}.")
        return from_torchvision(out[0], out[1])

    def __repr__(self) -> str:
        return f"AsGiven({self.op!r}, kind={self.kind!r})"
