"""torchvision's automatic augmentation policies on uint8 rows: ``TrivialAugmentWide``,
``RandAugment`` and ``AutoAugment`` (ImageNet policy).

Each draws what torchvision's ``forward`` draws (op choice, magnitude bin, sign, per-op
probabilities) with the same distributions, and ``params`` is the list of (op name, magnitude)
it applies, exactly the arguments torchvision passes to its ``_apply_op``. The ops compute as
``_apply_op`` does on PIL images: warps are nearest-neighbour by default with ``fill`` outside
(torchvision's default fill is black).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment import _functional as fn
from gpufeed.image.augment import _warp
from gpufeed.image.augment._base import RowOp
from gpufeed.image.augment._checks import check_fill, check_int, check_interpolation

__all__ = ["AutoAugment", "RandAugment", "TrivialAugmentWide", "apply_op", "augmentation_space"]

# (op name, signed) in torchvision's order; magnitudes from augmentation_space
_RAND_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
             "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
_SIGNED = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                     "Color", "Contrast", "Sharpness"})


@functools.lru_cache(maxsize=256)
def _lin(lo: float, hi: float, n: int) -> np.ndarray:
    """torch.linspace in float32: the magnitudes torchvision's tables hold, to the bit (numpy's
    linspace rounds some bins the other way)."""
    import torch

    return torch.linspace(lo, hi, n).numpy()


@functools.lru_cache(maxsize=64)
def _posterize_bits(n: int, span: int) -> np.ndarray:
    import torch

    return (8 - (torch.arange(n) / ((n - 1) / span)).round().int()).numpy().astype(np.int64)


@functools.lru_cache(maxsize=256)
def augmentation_space(policy: str, num_bins: int, height: int, width: int,
                       ) -> dict[str, np.ndarray | None]:
    """torchvision's ``_augmentation_space``: op name -> magnitudes (None: no magnitude), for
    ``policy`` "rand" (RandAugment), "wide" (TrivialAugmentWide) or "auto" (AutoAugment).
    Cached (rows of a loader share one size): read it, never change it."""
    if policy == "wide":
        geo = {"ShearX": _lin(0, 0.99, num_bins), "ShearY": _lin(0, 0.99, num_bins),
               "TranslateX": _lin(0, 32.0, num_bins), "TranslateY": _lin(0, 32.0, num_bins),
               "Rotate": _lin(0, 135.0, num_bins)}
        enhance, bits = _lin(0, 0.99, num_bins), _posterize_bits(num_bins, 6)
    else:
        geo = {"ShearX": _lin(0, 0.3, num_bins), "ShearY": _lin(0, 0.3, num_bins),
               "TranslateX": _lin(0, 150.0 / 331.0 * width, num_bins),
               "TranslateY": _lin(0, 150.0 / 331.0 * height, num_bins),
               "Rotate": _lin(0, 30.0, num_bins)}
        enhance, bits = _lin(0, 0.9, num_bins), _posterize_bits(num_bins, 4)
    space: dict[str, np.ndarray | None] = {} if policy == "auto" else {"Identity": None}
    space.update(geo)
    space.update({"Brightness": enhance, "Color": enhance, "Contrast": enhance,
                  "Sharpness": enhance, "Posterize": bits, "Solarize": _lin(255.0, 0, num_bins),
                  "AutoContrast": None, "Equalize": None})
    if policy == "auto":
        space["Invert"] = None
    return space


def apply_op(row: np.ndarray, op: str, magnitude: float, interpolation: str = "nearest",
             fill: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """torchvision's ``_apply_op(img, op, magnitude)`` on a uint8 (H, W, 3) row, as on PIL."""
    h, w = row.shape[:2]
    if op in ("ShearX", "ShearY"):
        shear = math.degrees(math.atan(magnitude))
        pair = (shear, 0.0) if op == "ShearX" else (0.0, shear)
        matrix = _warp.affine_matrix((0.0, 0.0), 0.0, (0.0, 0.0), 1.0, pair)
        return _warp.warp(row, matrix, fill, interpolation)
    if op in ("TranslateX", "TranslateY"):
        t = (int(magnitude), 0) if op == "TranslateX" else (0, int(magnitude))
        matrix = _warp.affine_matrix((w * 0.5, h * 0.5), 0.0, t, 1.0, (0.0, 0.0))
        return _warp.warp(row, matrix, fill, interpolation)
    if op == "Rotate":
        return _warp.warp(row, _warp.rotate_matrix(magnitude, h, w), fill, interpolation)
    if op in _ENHANCE:
        return _ENHANCE[op](row, 1.0 + magnitude)
    if op == "Posterize":
        return fn.posterize(row, int(magnitude))
    if op == "Solarize":
        return fn.solarize(row, magnitude)
    if op in _PLAIN:
        return _PLAIN[op](row)
    if op == "Identity":
        return row
    raise ValueError(f"unknown augmentation op {shorten(op)}; known: {sorted(_KNOWN)}.")


_ENHANCE = {"Brightness": fn.brightness, "Color": fn.color, "Contrast": fn.contrast,
            "Sharpness": fn.sharpness}
_PLAIN = {"AutoContrast": fn.autocontrast, "Equalize": fn.equalize, "Invert": fn.invert}
_KNOWN = {*_RAND_OPS, "Invert"}


class _Policy(RowOp):
    """A policy: ``params`` is ((op, magnitude), ...), applied in order by :func:`apply_op`."""

    interpolation: Any
    fill: Any

    def _set_common(self) -> None:
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        object.__setattr__(self, "fill", check_fill(self.fill))

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        for op, magnitude in params:
            row = apply_op(row, op, magnitude, self.interpolation, self.fill)
        return row


@dataclass(frozen=True)
class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide``: one op of 14 uniformly, a magnitude bin uniformly,
    a random sign for signed ops."""

    num_magnitude_bins: int = 31
    interpolation: Any = "nearest"
    fill: Any = None
    name = "TrivialAugmentWide"

    def __post_init__(self) -> None:
        check_int(self.num_magnitude_bins, "num_magnitude_bins", 2)
        self._set_common()

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        space = augmentation_space("wide", self.num_magnitude_bins, height, width)
        op = _RAND_OPS[int(rng.integers(len(_RAND_OPS)))]
        magnitudes = space[op]
        magnitude = 0.0 if magnitudes is None else float(magnitudes[int(rng.integers(len(magnitudes)))])
        if op in _SIGNED and rng.integers(2):
            magnitude = -magnitude
        return ((op, magnitude),)


@dataclass(frozen=True)
class RandAugment(_Policy):
    """torchvision's ``RandAugment(num_ops, magnitude, num_magnitude_bins)``: ``num_ops`` ops of
    14 uniformly (with replacement), each at bin ``magnitude``, a random sign for signed ops."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: Any = "nearest"
    fill: Any = None
    name = "RandAugment"

    def __post_init__(self) -> None:
        check_int(self.num_ops, "num_ops", 0)
        check_int(self.num_magnitude_bins, "num_magnitude_bins", 2)
        check_int(self.magnitude, "magnitude", 0, self.num_magnitude_bins - 1)
        self._set_common()

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        space = augmentation_space("rand", self.num_magnitude_bins, height, width)
        out = []
        for _ in range(self.num_ops):
            op = _RAND_OPS[int(rng.integers(len(_RAND_OPS)))]
            magnitudes = space[op]
            magnitude = 0.0 if magnitudes is None else float(magnitudes[self.magnitude])
            if op in _SIGNED and rng.integers(2):
                magnitude = -magnitude
            out.append((op, magnitude))
        return tuple(out)


# torchvision's AutoAugmentPolicy.IMAGENET: ((op, probability, magnitude bin or None), x2)
IMAGENET_POLICY: tuple[tuple[tuple[str, float, int | None], ...], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)


@dataclass(frozen=True)
class AutoAugment(_Policy):
    """torchvision's ``AutoAugment(AutoAugmentPolicy.IMAGENET)``: one of 25 sub-policies
    uniformly, each of its two ops with its probability, signs at random (10 magnitude bins)."""

    policy: str = "imagenet"
    interpolation: Any = "nearest"
    fill: Any = None
    name = "AutoAugment"

    def __post_init__(self) -> None:
        policy = str(getattr(self.policy, "value", self.policy)).lower()
        if policy != "imagenet":
            raise ValueError(f"`policy` must be 'imagenet' (the ImageNet policy; CIFAR10 and SVHN "
                             f"are not on the fast path). Found: {shorten(self.policy)}.")
        object.__setattr__(self, "policy", policy)
        self._set_common()

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        space = augmentation_space("auto", 10, height, width)
        sub = IMAGENET_POLICY[int(rng.integers(len(IMAGENET_POLICY)))]
        probs = rng.random(2)
        signs = rng.integers(2, size=2)
        out = []
        for i, (op, p, bin_id) in enumerate(sub):
            if probs[i] <= p:
                magnitudes = space[op]
                magnitude = 0.0 if bin_id is None or magnitudes is None else float(magnitudes[bin_id])
                if op in _SIGNED and signs[i] == 0:
                    magnitude = -magnitude
                out.append((op, magnitude))
        return tuple(out)
