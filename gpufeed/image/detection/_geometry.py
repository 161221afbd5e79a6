"""Flips and resizes of a whole sample (image, boxes, masks, keypoints) with torchvision v2's
semantics (0.29), and the joint ops built on them: ``RandomHorizontalFlip``,
``RandomVerticalFlip``, ``Resize``, ``ScaleJitter``, ``RandomShortestSize``, ``RandomResize``.
Crops and pads: ``_crops.py``.

Images are (H, W, 3) uint8. An antialiased shrink (bilinear or bicubic) is torch's own
``interpolate`` on the uint8 image, as torchvision runs it (exact, and on one thread faster than
OpenCV's INTER_AREA, which is 1-2 levels off torch's filter); enlargements and resizes without
antialiasing use OpenCV's INTER_LINEAR / INTER_CUBIC (the same half-pixel sampling as torch's);
nearest resizes pick torch's source pixels exactly. Masks are resized by index maps
(:meth:`Mask.select`), boxes and keypoints by the size ratios; a resize clamps none of them
(torchvision does not either).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gpufeed.image.detection._boxes import flip_boxes
from gpufeed.image.detection._sample import (
    Boxes,
    ImageWindow,
    JointOp,
    KeyPoints,
    Mask,
    Sample,
    is_integer_dtype,
    map_leaves,
    torch_nearest_index,
)

__all__ = [
    "RandomHorizontalFlip",
    "RandomResize",
    "RandomShortestSize",
    "RandomVerticalFlip",
    "Resize",
    "ScaleJitter",
    "check_p",
    "flip_sample",
    "interpolation_name",
    "nearest_exact_index",
    "resize_image",
    "resize_sample",
    "resized_size",
]

#: PIL's integer filter codes, which torchvision accepts as interpolations.
_PIL_CODES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic")
#: PIL's nearest resize, which torchvision runs on a PIL image (an op before the conversion to
#: tensor): the translation's name for such an op's "nearest" (masks, tensors there too, keep
#: torch's nearest)
PIL_NEAREST = "pil-nearest"


def interpolation_name(interpolation: Any) -> str:
    """The name of a torchvision interpolation (a string, an ``InterpolationMode`` or a PIL
    code); only "nearest", "nearest-exact", "bilinear" and "bicubic" are supported."""
    value = getattr(interpolation, "value", interpolation)
    if isinstance(value, int) and not isinstance(value, bool):
        value = _PIL_CODES.get(value, value)
    name = value.lower() if isinstance(value, str) else value
    if name not in INTERPOLATIONS and name != PIL_NEAREST:
        raise ValueError(f"`interpolation` must be one of {', '.join(INTERPOLATIONS)} (others run as "
                         f"given). Found: {interpolation!r}.")
    return str(name)


def check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"`p` must be in [0, 1]. Found: {p}.")


def resized_size(canvas: tuple[int, int], size: Sequence[int] | int | None,
                 max_size: int | None = None) -> tuple[int, int]:
    """(H, W) a resize to ``size`` gives on ``canvas``, as torchvision's
    ``_compute_resized_output_size``: (h, w); [s] or s: the shorter edge to s, the longer in
    proportion (truncated), then both scaled down so the longer is at most ``max_size``; None:
    the longer edge to ``max_size``."""
    h, w = canvas
    if isinstance(size, int):
        size = [size]
    if size is not None and len(size) not in (1, 2):
        raise ValueError(f"`size` must be an int, one or two ints, or None. Found: {size!r}.")
    short, long = (w, h) if w <= h else (h, w)
    if size is None:
        if not isinstance(max_size, int):
            raise ValueError(f"`max_size` must be an int when `size` is None. Found: {max_size!r}.")
        new_short, new_long = int(max_size * short / long), max_size
    elif len(size) == 1:
        new_short, new_long = size[0], int(size[0] * long / short)
        if max_size is not None:
            if max_size <= size[0]:
                raise ValueError(f"`max_size` must be greater than the shorter edge's size {size[0]}. "
                                 f"Found: {max_size}.")
            if new_long > max_size:
                new_short, new_long = int(max_size * new_short / new_long), max_size
    else:
        if max_size is not None:
            raise ValueError("`max_size` must be None when `size` gives both edges. "
                             f"Found: max_size={max_size}, size={list(size)}.")
        return int(size[0]), int(size[1])
    return (new_long, new_short) if w <= h else (new_short, new_long)


def nearest_exact_index(in_size: int, out_size: int) -> np.ndarray:
    """Source index of each output index under torch's ``interpolate(mode="nearest-exact")``:
    ``min(floor((dst + 0.5) * (in / out)), in - 1)`` in float32."""
    scale = np.float32(in_size) / np.float32(out_size)
    dst = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
    return np.minimum(np.floor(dst * scale).astype(np.int64), in_size - 1)


def pil_nearest_index(in_size: int, out_size: int) -> np.ndarray:
    """Source index of each output index under PIL's nearest resize: PIL steps a float64
    coordinate from half a step by adding the step (``in / out``) once per output pixel, and
    truncates it (not ``floor((dst + 0.5) * step)``, which differs from it at times)."""
    step = in_size / out_size
    steps = np.full(out_size, step)
    steps[:1] = step * 0.5
    return np.minimum(np.add.accumulate(steps).astype(np.int64), in_size - 1)


def _index(interpolation: str, in_size: int, out_size: int) -> np.ndarray:
    if interpolation == "nearest-exact":
        return nearest_exact_index(in_size, out_size)
    if interpolation == PIL_NEAREST:
        return pil_nearest_index(in_size, out_size)
    return torch_nearest_index(in_size, out_size)


def resize_image(img: np.ndarray, oh: int, ow: int, interpolation: str = "bilinear",
                 antialias: bool | None = True) -> np.ndarray:
    """An (H, W, 3) uint8 image resized to (oh, ow): nearest modes pick torch's source pixels;
    an antialiased shrink is torch's; the rest OpenCV's linear or cubic resize."""
    import cv2

    h, w = img.shape[:2]
    if (h, w) == (oh, ow):
        return img
    if interpolation in ("nearest", "nearest-exact", PIL_NEAREST):
        return img[_index(interpolation, h, oh)][:, _index(interpolation, w, ow)]
    if _by_torch((h, w), (oh, ow), interpolation, antialias):
        return _torch_resize(img, oh, ow, interpolation)
    mode = cv2.INTER_CUBIC if interpolation == "bicubic" else cv2.INTER_LINEAR
    return cv2.resize(np.ascontiguousarray(img), (ow, oh), interpolation=mode)


def _by_torch(hw: tuple[int, int], out: tuple[int, int], interpolation: str, antialias: bool | None) -> bool:
    """Whether ``resize_image`` resizes (H, W) to ``out`` with torch's antialiased kernel: a
    bilinear or bicubic shrink with antialias, or any antialiased bicubic (torch's is Keys'
    a=-0.5 at any scale; OpenCV's cubic is -0.75)."""
    (h, w), (oh, ow) = hw, out
    return (bool(antialias) and interpolation in ("bilinear", "bicubic") and (h, w) != (oh, ow)
            and (oh < h or ow < w or interpolation == "bicubic"))


def _torch_resize(img: np.ndarray, oh: int, ow: int, mode: str) -> np.ndarray:
    """``interpolate(mode, antialias=True)`` of an (H, W, 3) uint8 image, as torchvision runs it
    (native uint8 on the CPU, channels-last; exact, and faster than OpenCV's INTER_AREA)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).unsqueeze(0)
    # A 1xCxHxW channels-last input gives a contiguous (NCHW) output unless its batch stride is
    # restrided, as torchvision does; channels-last out, the HWC view below is contiguous.
    t = t.as_strided(t.shape, (t.numel(),) + t.stride()[1:])
    out = torch.nn.functional.interpolate(t, size=(oh, ow), mode=mode, align_corners=False, antialias=True)
    return np.ascontiguousarray(out[0].permute(1, 2, 0).numpy())


def resize_window(window: ImageWindow, oh: int, ow: int, mode: str) -> np.ndarray | None:
    """``_torch_resize(window.materialize(), oh, ow, mode)`` without building the window's rows
    that are all fill (a zoom-out's canvas): the same bytes. torch's antialiased resize is
    separable, a horizontal pass into a uint8 image ``ow`` wide then a vertical pass, each pass
    skipped when its size is kept, and a row's horizontal pass depends on that row alone, so a
    fill row's is computed once. None when under a quarter of the rows are fill (then building
    the window costs little: the caller materialises it)."""
    top, bottom, left, right = window.margins
    h, w = window.size
    if (top + bottom) * 4 < h or window.y1 <= window.y0 or window.x1 <= window.x0:
        return None
    if window.vflip:
        top, bottom = bottom, top
    band = ImageWindow(window.src, (window.y0, window.y1, window.x0, window.x1), (0, 0, left, right),
                       window.fill, window.hflip, window.vflip, window.ops).materialize()
    fill_row = np.empty((1, w, 3), np.uint8)
    fill_row[:] = window.fill
    mid = np.empty((h, ow, 3), np.uint8)
    if ow != w:
        fill_row = _torch_resize(fill_row, 1, ow, mode)
        band = _torch_resize(band, band.shape[0], ow, mode)
    mid[:top] = fill_row
    mid[h - bottom:] = fill_row
    mid[top:h - bottom] = band
    return mid if oh == h else _torch_resize(mid, oh, ow, mode)


def _resized_image(sample: Sample, oh: int, ow: int, interpolation: str, antialias: bool | None) -> np.ndarray:
    """``resize_image`` of the sample's image; a pending window with many fill rows is
    resampled without being built (``resize_window``)."""
    window = sample.image_window()
    if window is not None and any(window.margins[:2]) and _by_torch(window.size, (oh, ow), interpolation, antialias):
        out = resize_window(window, oh, ow, interpolation)
        if out is not None:
            return out
    return resize_image(sample.image, oh, ow, interpolation, antialias)


def resize_sample(sample: Sample, size: Sequence[int] | int | None, max_size: int | None = None,
                  interpolation: str = "bilinear", antialias: bool | None = True) -> Sample:
    """``F.resize(size, max_size)`` of the image and every leaf (each leaf's output size from its
    own canvas, as torchvision's kernels compute it); masks by nearest (or nearest-exact)
    index maps."""
    oh, ow = resized_size(sample.size, size, max_size)
    image = _resized_image(sample, oh, ow, interpolation, antialias)
    mask_mode = "nearest-exact" if interpolation == "nearest-exact" else "nearest"

    def leaf(x: Any) -> Any:
        if isinstance(x, (Boxes, KeyPoints)):
            h, w = x.canvas
            nh, nw = resized_size((h, w), size, max_size)
            if (nh, nw) == (h, w):
                return x
            rw, rh = nw / w, nh / h
            # torchvision's ratios are a float32 tensor; an integer leaf times them is float32
            ratios = np.array([rw, rh, rw, rh] if isinstance(x, Boxes) else [rw, rh], np.float32)
            if is_integer_dtype(x.dtype):
                data = (x.data.astype(np.float32) * ratios).astype(np.float64)
            else:
                data = x.data * ratios.astype(np.float64)
            return dataclasses.replace(x, data=data, canvas=(nh, nw))
        if isinstance(x, Mask):
            h, w = x.size
            nh, nw = resized_size((h, w), size, max_size)
            if (nh, nw) == (h, w):
                return x
            out = dataclasses.replace(x)
            out.select(_index(mask_mode, h, nh), _index(mask_mode, w, nw))
            return out
        return x

    return Sample(image, map_leaves(sample.target, leaf))


def flip_sample(sample: Sample, horizontal: bool) -> Sample:
    """``F.horizontal_flip`` (or ``vertical_flip``) of the image and every leaf."""
    import cv2

    window = sample.image_window()
    image = None if window is not None else cv2.flip(sample.image, 1 if horizontal else 0)

    def leaf(x: Any) -> Any:
        if isinstance(x, Boxes):
            return dataclasses.replace(x, data=flip_boxes(x, horizontal))
        if isinstance(x, KeyPoints):
            data = np.array(x.data, dtype=np.float64)
            axis, extent = (0, x.canvas[1]) if horizontal else (1, x.canvas[0])
            data[..., axis] = extent - 1 - data[..., axis]
            return dataclasses.replace(x, data=data)
        if isinstance(x, Mask):
            out = dataclasses.replace(x)
            h, w = x.size
            if horizontal:
                out.select(None, np.arange(w - 1, -1, -1))
            else:
                out.select(np.arange(h - 1, -1, -1), None)
            return out
        return x

    target = map_leaves(sample.target, leaf)
    if window is not None:  # flipped when the window is read (cv2.flip of the source part)
        return Sample.windowed(window.flip(horizontal), target)
    assert image is not None
    return Sample(image, target)


@dataclass(frozen=True)
class _RandomFlip(JointOp):
    """Flips with probability ``p`` (horizontally when the class says so)."""

    p: float = 0.5
    horizontal: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_p(self.p)

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return None if rng.random() >= self.p else {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        return flip_sample(sample, horizontal=self.horizontal)


@dataclass(frozen=True)
class RandomHorizontalFlip(_RandomFlip):
    """torchvision's ``RandomHorizontalFlip``: flips with probability ``p``."""

    name = "RandomHorizontalFlip"


@dataclass(frozen=True)
class RandomVerticalFlip(_RandomFlip):
    """torchvision's ``RandomVerticalFlip``: flips with probability ``p``."""

    name = "RandomVerticalFlip"
    horizontal: ClassVar[bool] = False


def _check_resize(interpolation: Any, antialias: Any) -> str:
    """The interpolation's name (kept instead of a torchvision enum, so that an op pickles
    without torchvision)."""
    name = interpolation_name(interpolation)
    if antialias not in (True, False, None):
        raise ValueError(f"`antialias` must be True, False or None. Found: {antialias!r}.")
    return name


@dataclass(frozen=True)
class Resize(JointOp):
    """torchvision's ``Resize``: ``size`` (h, w), [s] or s (the shorter edge), or None (the longer
    edge to ``max_size``); ``max_size`` caps the longer edge of a shorter-edge resize."""

    size: Any
    interpolation: Any = "bilinear"
    max_size: int | None = None
    antialias: bool | None = True
    name = "Resize"

    def __post_init__(self) -> None:
        size = self.size
        if isinstance(size, numbers.Integral) and not isinstance(size, bool):
            size = [int(size)]
        elif isinstance(size, Sequence) and len(size) in (1, 2) and all(
                isinstance(s, numbers.Integral) for s in size):
            size = [int(s) for s in size]
        elif size is None:
            if not isinstance(self.max_size, int):
                raise ValueError(f"`max_size` must be an int when `size` is None. Found: {self.max_size!r}.")
        else:
            raise ValueError(f"`size` must be an int, one or two ints, or None. Found: {size!r}.")
        if size is not None and len(size) == 2 and self.max_size is not None:
            raise ValueError("`max_size` must be None when `size` gives both edges. "
                             f"Found: {self.max_size}.")
        if size is not None and len(size) == 1 and self.max_size is not None and self.max_size <= size[0]:
            raise ValueError(f"`max_size` must be greater than `size` {size[0]}. Found: {self.max_size}.")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "interpolation", _check_resize(self.interpolation, self.antialias))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        return resize_sample(sample, self.size, self.max_size, self.interpolation,
                             self.antialias)


@dataclass(frozen=True)
class ScaleJitter(JointOp):
    """torchvision's ``ScaleJitter`` (large scale jitter): scale s ~ U(``scale_range``), the image
    resized by r = s * min(target_size[1] / H, target_size[0] / W), each edge truncated."""

    target_size: tuple[int, int]
    scale_range: tuple[float, float] = (0.1, 2.0)
    interpolation: Any = "bilinear"
    antialias: bool | None = True
    name = "ScaleJitter"

    def __post_init__(self) -> None:
        if len(self.target_size) != 2 or min(self.target_size) <= 0:
            raise ValueError(f"`target_size` must be two sizes > 0. Found: {self.target_size!r}.")
        if len(self.scale_range) != 2 or not 0 < self.scale_range[0] <= self.scale_range[1]:
            raise ValueError(f"`scale_range` must be (min, max) with 0 < min <= max. Found: {self.scale_range!r}.")
        object.__setattr__(self, "interpolation", _check_resize(self.interpolation, self.antialias))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        h, w = sample.size
        lo, hi = self.scale_range
        scale = lo + rng.random() * (hi - lo)
        r = min(self.target_size[1] / h, self.target_size[0] / w) * scale
        return {"size": (int(h * r), int(w * r))}

    def apply(self, sample: Sample, params: Any) -> Sample:
        return resize_sample(sample, list(params["size"]), None, self.interpolation,
                             self.antialias)


@dataclass(frozen=True)
class RandomShortestSize(JointOp):
    """torchvision's ``RandomShortestSize``: the shorter edge to one of ``min_size`` (uniform),
    scaled down so the longer edge is at most ``max_size``; edges truncated."""

    min_size: Any
    max_size: int | None = None
    interpolation: Any = "bilinear"
    antialias: bool | None = True
    name = "RandomShortestSize"

    def __post_init__(self) -> None:
        sizes = [self.min_size] if isinstance(self.min_size, int) else list(self.min_size)
        if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
            raise ValueError(f"`min_size` must be an int or ints > 0. Found: {self.min_size!r}.")
        object.__setattr__(self, "min_size", sizes)
        if self.max_size is not None and self.max_size <= 0:
            raise ValueError(f"`max_size` must be > 0 or None. Found: {self.max_size!r}.")
        object.__setattr__(self, "interpolation", _check_resize(self.interpolation, self.antialias))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        h, w = sample.size
        short = self.min_size[int(rng.integers(len(self.min_size)))]
        r = short / min(h, w)
        if self.max_size is not None:
            r = min(r, self.max_size / max(h, w))
        return {"size": (int(h * r), int(w * r))}

    def apply(self, sample: Sample, params: Any) -> Sample:
        return resize_sample(sample, list(params["size"]), None, self.interpolation,
                             self.antialias)


@dataclass(frozen=True)
class RandomResize(JointOp):
    """torchvision's ``RandomResize``: the shorter edge to s ~ uniform integers in
    [``min_size``, ``max_size``), the longer in proportion."""

    min_size: int
    max_size: int
    interpolation: Any = "bilinear"
    antialias: bool | None = True
    name = "RandomResize"

    def __post_init__(self) -> None:
        if not 0 < self.min_size < self.max_size:
            raise ValueError("`min_size` and `max_size` must be 0 < min_size < max_size. "
                             f"Found: {self.min_size}, {self.max_size}.")
        object.__setattr__(self, "interpolation", _check_resize(self.interpolation, self.antialias))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {"size": [int(rng.integers(self.min_size, self.max_size))]}

    def apply(self, sample: Sample, params: Any) -> Sample:
        return resize_sample(sample, params["size"], None, self.interpolation,
                             self.antialias)
