"""Where one augmentation op of a torchvision or timm pipeline runs on gpufeed's fast path.

The pipeline walk (``gpufeed.image``) handles the crop/resize, the conversion to a
tensor, dtype and ``Normalize`` itself and asks :func:`place` about every other op, with the
domain the op sees in the original pipeline:

- ``"pil"``: a PIL image (before ``ToTensor`` / ``PILToTensor`` / ``ToImage``);
- ``"uint8"``: a uint8 tensor; ``"float"``: a float tensor on the 0-1 scale, before ``Normalize``;
- ``"normalized"``: the float tensor after ``Normalize``.

The answer, in order of preference:

1. ``fast``: gpufeed has the op (``gpufeed.image.augment``), built with the op's own parameters and
   run on the uint8 row in the worker (``RandomErasing``: on the normalized float row);
2. ``tensor``: the op accepts tensors (a torchvision op, or any callable or ``torch.nn.Module``
   the original pipeline already hands a tensor): run as given on the row
   (:class:`~gpufeed.image._tensor_ops.TensorOp`);
3. ``float``: the same after ``Normalize``, on the normalized float row
   (:class:`~gpufeed.image._tensor_ops.TensorFloatOp`);
4. ``pil``: the op needs a PIL image, changes the image size, or comes before the crop: the
   pipeline runs as given on PIL images; the note says why and what to use instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpufeed.image._recipe_table import TIMM_PREFIX, TV_PREFIX, gpufeed_op
from gpufeed.image._tensor_ops import TensorFloatOp, TensorOp
from gpufeed.image.augment._base import FloatRowOp, RowOp

__all__ = ["Placed", "place"]

#: torchvision ops that change the image's size (gpufeed does one crop + resize per image)
_RESIZING = frozenset({
    "Resize", "CenterCrop", "RandomCrop", "RandomResizedCrop", "Pad", "FiveCrop", "TenCrop",
    "ScaleJitter", "RandomShortestSize", "RandomResize", "RandomZoomOut", "RandomIoUCrop",
    "RandomCropOrPad", "CenterCropOrPad", "RandomPad", "ResizeKeepRatio",
    "TrimBorder", "RandomResizedCropAndInterpolation",
})
#: torchvision classes that take PIL images only (v1 ops that are not ``nn.Module``s)
_PIL_ONLY = frozenset({"ToPILImage", "Lambda"})
_CONTAINERS = frozenset({"RandomApply", "RandomChoice", "RandomOrder"})


@dataclass(frozen=True)
class Placed:
    """Where one op runs (``where``: "fast", "tensor", "float" or "pil") and why (``note``);
    the gpufeed op that runs it (``row_op`` on the uint8 row, ``float_op`` after normalize)."""

    where: str
    note: str
    row_op: RowOp | None = None
    float_op: FloatRowOp | None = None


def _module(op: Any) -> str:
    return type(op).__module__


def tensor_capable(op: Any) -> bool:
    """True for a torchvision op that accepts tensor images: every v2 op but ``ToPILImage``;
    a v1 op that is an ``nn.Module`` (torchvision's mark of tensor support), or a v1
    ``RandomChoice``/``RandomOrder`` whose ops all are."""
    name = type(op).__name__
    if name in _PIL_ONLY:
        return False
    if _module(op).startswith(TV_PREFIX + ".v2"):
        return True
    if name in _CONTAINERS and hasattr(op, "transforms"):
        return all(tensor_capable(inner) for inner in op.transforms)
    return isinstance(op, torch.nn.Module)


def place(op: Any, *, domain: str, after_geometry: bool, text: str) -> Placed:
    """Where ``op`` runs on the fast path (module docstring); ``text`` is its one-line repr."""
    name = type(op).__name__
    known = _module(op).startswith((TV_PREFIX, TIMM_PREFIX))
    if known and name == "Grayscale" and getattr(op, "num_output_channels", 1) != 3:
        return Placed("pil", "Grayscale(num_output_channels=1) makes one-channel images; gpufeed "
                             "batches RGB rows (use Grayscale(num_output_channels=3) or "
                             "RandomGrayscale(p=1.0))")
    if known and name in _RESIZING:
        return Placed("pil", f"{name} changes the image's size after the crop; gpufeed does one "
                             f"crop + resize per image (use one RandomResizedCrop, or Resize(int) "
                             f"+ CenterCrop)")
    if not after_geometry:
        return Placed("pil", "comes before the crop/resize: gpufeed runs augmentations on the "
                             "cropped rows; move it after RandomResizedCrop (or CenterCrop)")
    why = ""
    if known:
        made = gpufeed_op(op, domain)
        if isinstance(made, RowOp) and domain == "normalized":  # the row op runs before it
            made = f"{name} after Normalize (gpufeed's op works on the uint8 row)"
        if isinstance(made, RowOp):
            return Placed("fast", f"gpufeed.image.augment.{made.name} on the uint8 row in the worker",
                          row_op=made)
        if isinstance(made, FloatRowOp):
            return Placed("fast", f"gpufeed.image.augment.{made.name} on the normalized float row",
                          float_op=made)
        if isinstance(made, str):  # the parameters gpufeed cannot take, or where it cannot run
            why = f"{made}; "
    if name == "ToPILImage" or (domain == "pil" and not (known and tensor_capable(op))):
        if known:
            return Placed("pil", f"{why}{name} needs a PIL image; use an op that accepts "
                                 f"tensors (torchvision.transforms.v2) or gpufeed.image.augment")
        return Placed("pil", f"{_describe(op)} is given a PIL image in this pipeline; place it "
                             f"after ToTensor / PILToTensor / ToImage (it then runs on the "
                             f"fast path's rows as a tensor op)")
    fn: Callable[[torch.Tensor], Any] = op
    if domain == "normalized":
        return Placed("float", f"{why}run as given on the normalized float row (tensor op)",
                      float_op=TensorFloatOp(fn))
    kind = "uint8 (3, H, W)" if domain in ("pil", "uint8") else "float32 0-1 (3, H, W)"
    return Placed("tensor", f"{why}run as given on the row as a {kind} tensor, after the fast "
                            f"decode and crop (tensor op)",
                  row_op=TensorOp(fn, "float" if domain == "float" else "uint8"))


def _describe(op: Any) -> str:
    kind = "torch.nn.Module" if isinstance(op, torch.nn.Module) else "callable"
    return f"{kind} {_module(op)}.{type(op).__qualname__}"
