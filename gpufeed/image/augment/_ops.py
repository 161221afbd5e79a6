"""Single augmentation ops on uint8 rows, with torchvision's names, arguments and draws.

Each op draws its parameters as torchvision draws them (the same distributions, from
:func:`~gpufeed.image.augment._base.row_rng`) and computes the pixels as PIL does
(:mod:`~gpufeed.image.augment._functional`). ``params`` of an op is None when it does nothing
to this row (a probability not met).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import is_int, shorten
from gpufeed.image.augment import _functional as fn
from gpufeed.image.augment import _warp
from gpufeed.image.augment._base import RowOp
from gpufeed.image.augment._checks import (
    check_fill,
    check_int,
    check_interpolation,
    check_number,
    check_p,
    check_range,
)

__all__ = ["ColorJitter", "GaussianBlur", "RandomAdjustSharpness", "RandomAutocontrast",
           "RandomEqualize", "RandomGrayscale", "RandomHorizontalFlip", "RandomInvert",
           "RandomAffine", "RandomPosterize", "RandomRotation", "RandomSolarize", "RandomVerticalFlip"]


class _Maybe(RowOp):
    """An op applied with probability ``p`` (torchvision: ``torch.rand(1) < p``)."""

    p: float

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        return True if rng.random() < self.p else None

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        return row if params is None else self._run(row)

    def _run(self, row: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class RandomHorizontalFlip(_Maybe):
    """Mirror left-right with probability ``p``."""

    p: float = 0.5
    name = "RandomHorizontalFlip"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.flip(row, 1)


@dataclass(frozen=True)
class RandomVerticalFlip(_Maybe):
    """Mirror top-bottom with probability ``p``."""

    p: float = 0.5
    name = "RandomVerticalFlip"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.flip(row, 0)


@dataclass(frozen=True)
class RandomGrayscale(_Maybe):
    """PIL's grey conversion, as three equal channels, with probability ``p``."""

    p: float = 0.1
    name = "RandomGrayscale"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.grayscale(row)


@dataclass(frozen=True)
class RandomSolarize(_Maybe):
    """``ImageOps.solarize(threshold)`` with probability ``p``."""

    threshold: float = 128.0
    p: float = 0.5
    name = "RandomSolarize"

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", check_number(self.threshold, "threshold", 0, 256))
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.solarize(row, self.threshold)


@dataclass(frozen=True)
class RandomPosterize(_Maybe):
    """``ImageOps.posterize(bits)`` with probability ``p``."""

    bits: int = 4
    p: float = 0.5
    name = "RandomPosterize"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", check_int(self.bits, "bits", 0, 8))
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.posterize(row, self.bits)


@dataclass(frozen=True)
class RandomEqualize(_Maybe):
    """``ImageOps.equalize`` with probability ``p``."""

    p: float = 0.5
    name = "RandomEqualize"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.equalize(row)


@dataclass(frozen=True)
class RandomAutocontrast(_Maybe):
    """``ImageOps.autocontrast`` with probability ``p``."""

    p: float = 0.5
    name = "RandomAutocontrast"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.autocontrast(row)


@dataclass(frozen=True)
class RandomInvert(_Maybe):
    """``ImageOps.invert`` with probability ``p``."""

    p: float = 0.5
    name = "RandomInvert"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.invert(row)


@dataclass(frozen=True)
class RandomAdjustSharpness(_Maybe):
    """``ImageEnhance.Sharpness(img).enhance(sharpness_factor)`` with probability ``p``."""

    sharpness_factor: float = 2.0
    p: float = 0.5
    name = "RandomAdjustSharpness"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharpness_factor",
                           check_number(self.sharpness_factor, "sharpness_factor", 0))
        object.__setattr__(self, "p", check_p(self.p))

    def _run(self, row: np.ndarray) -> np.ndarray:
        return fn.sharpness(row, self.sharpness_factor)


_JITTER = ("brightness", "contrast", "saturation", "hue")


@dataclass(frozen=True)
class ColorJitter(RowOp):
    """torchvision's ``ColorJitter``: the four adjustments in a random order, each factor uniform
    in its range (a number v: [max(0, 1 - v), 1 + v]; hue: [-v, v], v <= 0.5; a pair: (min, max)).
    ``params``: ((op index 0-3, factor), ...) in the order applied."""

    brightness: Any = 0
    contrast: Any = 0
    saturation: Any = 0
    hue: Any = 0
    name = "ColorJitter"

    def __post_init__(self) -> None:
        for which in _JITTER[:3]:
            object.__setattr__(self, which, check_range(getattr(self, which), which, 1.0))
        object.__setattr__(self, "hue", check_range(self.hue, "hue", 0.0, -0.5, 0.5))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        order = rng.permutation(4)
        factors = {}
        for i, which in enumerate(_JITTER):  # drawn in torchvision's order: b, c, s, h
            pair = getattr(self, which)
            if pair is not None:
                factors[i] = float(rng.uniform(pair[0], pair[1]))
        return tuple((int(i), factors[int(i)]) for i in order if int(i) in factors)

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        for i, factor in params:
            row = _JITTER_FNS[i](row, factor)
        return row


_JITTER_FNS = (fn.brightness, fn.contrast, fn.color, fn.hue)


@dataclass(frozen=True)
class GaussianBlur(RowOp):
    """torchvision's ``GaussianBlur(kernel_size, sigma)``: sigma uniform in ``sigma`` (a number:
    fixed), the same for both axes. ``kernel_size``: odd int or (x, y)."""

    kernel_size: Any = 3
    sigma: Any = (0.1, 2.0)
    name = "GaussianBlur"

    def __post_init__(self) -> None:
        ks = self.kernel_size
        pair = (ks, ks) if isinstance(ks, int) else tuple(ks) if isinstance(ks, (tuple, list)) else ()
        if len(pair) != 2 or not all(is_int(k) and k > 0
                                     and k % 2 == 1 for k in pair):
            raise ValueError(f"`kernel_size` must be an odd int > 0 or a pair of them. "
                             f"Found: {shorten(ks)}.")
        object.__setattr__(self, "kernel_size", (int(pair[0]), int(pair[1])))
        sigma = self.sigma
        if isinstance(sigma, (int, float)) and not isinstance(sigma, bool):
            sigma = (sigma, sigma)
        if not (isinstance(sigma, (tuple, list)) and len(sigma) == 2):
            raise ValueError(f"`sigma` must be a number or a (min, max) pair. Found: {shorten(self.sigma)}.")
        lo, hi = (check_number(s, "sigma", 1e-9) for s in sigma)
        if lo > hi:
            raise ValueError(f"`sigma` must be (min, max) with min <= max. Found: {shorten(self.sigma)}.")
        object.__setattr__(self, "sigma", (lo, hi))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        return float(rng.uniform(self.sigma[0], self.sigma[1]))

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        return fn.blur(row, self.kernel_size, (params, params))


@dataclass(frozen=True)
class RandomRotation(RowOp):
    """torchvision's ``RandomRotation(degrees)`` on PIL images: angle uniform in ``degrees``
    (a number d: [-d, d]), counter-clockwise about the centre, same size, ``fill`` outside."""

    degrees: Any = 0
    interpolation: Any = "nearest"
    fill: Any = 0
    name = "RandomRotation"

    def __post_init__(self) -> None:
        degrees = check_range(self.degrees, "degrees", None, -360, 360)
        object.__setattr__(self, "degrees", degrees or (0.0, 0.0))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        object.__setattr__(self, "fill", check_fill(self.fill))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        return float(rng.uniform(self.degrees[0], self.degrees[1]))

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        h, w = row.shape[:2]
        return _warp.warp(row, _warp.rotate_matrix(params, h, w), self.fill, self.interpolation)


def _pairs(value: Any, name: str, sizes: tuple[int, ...], lo: float, hi: float,
           ordered: bool = True) -> tuple[float, ...] | None:
    """None, or a tuple of ``sizes`` numbers in [lo, hi] ((min, max) pairs if ``ordered``)."""
    if value is None:
        return None
    try:
        out = tuple(check_number(v, name, lo, hi) for v in value)
    except TypeError:
        out = ()
    if len(out) not in sizes or (ordered and any(out[i] > out[i + 1]
                                                  for i in range(0, len(out) - 1, 2))):
        raise ValueError(f"`{name}` must be None or {' or '.join(map(str, sizes))} numbers in "
                         f"[{lo}, {hi}]. Found: {shorten(value)}.")
    return out


@dataclass(frozen=True)
class RandomAffine(RowOp):
    """torchvision's ``RandomAffine(degrees, translate, scale, shear)`` on PIL images, about the
    centre, same size, ``fill`` outside: angle uniform in ``degrees`` (a number d: [-d, d]);
    translation int(round(uniform(-t w, t w))) pixels (and so for y) for ``translate`` (tx, ty);
    scale uniform in ``scale`` (min, max); x shear uniform in ``shear``'s first pair (a number
    s: [-s, s]), y shear in its second pair if it has one (degrees).
    ``params``: (angle, (dx, dy), scale, (shear x, shear y))."""

    degrees: Any = 0
    translate: Any = None
    scale: Any = None
    shear: Any = None
    interpolation: Any = "nearest"
    fill: Any = 0
    name = "RandomAffine"

    def __post_init__(self) -> None:
        degrees = check_range(self.degrees, "degrees", None, -360, 360)
        object.__setattr__(self, "degrees", degrees or (0.0, 0.0))
        object.__setattr__(self, "translate", _pairs(self.translate, "translate", (2,), 0, 1,
                                                     ordered=False))
        object.__setattr__(self, "scale", _pairs(self.scale, "scale", (2,), 1e-9, math.inf))
        shear = self.shear
        if isinstance(shear, (int, float)) and not isinstance(shear, bool):
            if shear < 0:
                raise ValueError(f"`shear` must be >= 0 when a single number. Found: {shorten(shear)}.")
            shear = (-float(shear), float(shear))
        object.__setattr__(self, "shear", _pairs(shear, "shear", (2, 4), -180, 180))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        object.__setattr__(self, "fill", check_fill(self.fill))

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        angle = float(rng.uniform(self.degrees[0], self.degrees[1]))
        shift = (0, 0)
        if self.translate is not None:
            dx, dy = self.translate[0] * width, self.translate[1] * height
            shift = (int(round(rng.uniform(-dx, dx))), int(round(rng.uniform(-dy, dy))))
        scale = 1.0 if self.scale is None else float(rng.uniform(self.scale[0], self.scale[1]))
        shear = (0.0, 0.0)
        if self.shear is not None:
            sx = float(rng.uniform(self.shear[0], self.shear[1]))
            sy = float(rng.uniform(self.shear[2], self.shear[3])) if len(self.shear) == 4 else 0.0
            shear = (sx, sy)
        return angle, shift, scale, shear

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        angle, shift, scale, shear = params
        h, w = row.shape[:2]
        matrix = _warp.affine_matrix((w * 0.5, h * 0.5), angle, shift, scale, shear)
        return _warp.warp(row, matrix, self.fill, self.interpolation)
