"""``RandomErasing`` on normalized float rows (3, H, W), where torchvision and timm run it.

Two ops with the same pixel work (a rectangle set to a value) and the two libraries' draws:

- :class:`RandomErasing`: torchvision's (``p``, ``scale``, ``ratio``, ``value``: a number,
  three numbers, or "random" for per-pixel standard normal values);
- :class:`TimmRandomErasing`: timm's (``probability``, ``min_area``/``max_area``,
  ``min_aspect``/``max_aspect``, ``mode`` "const" (zeros), "rand" (one normal value per
  channel) or "pixel" (per-pixel normal values), ``min_count``/``max_count`` rectangles).

``params``: a tuple of (top, left, height, width, value) rectangles, ``value`` a float32 array
broadcastable to (3, height, width); empty when nothing is erased. Rows are torch tensors or
numpy arrays, written in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment._base import FloatRowOp
from gpufeed.image.augment._checks import check_int, check_number, check_p

__all__ = ["RandomErasing", "TimmRandomErasing", "erase"]


def erase(row: Any, boxes: tuple[tuple[int, int, int, int, np.ndarray], ...]) -> Any:
    """Set each (top, left, height, width, value) box of ``row`` ((C, H, W)) to its value."""
    for top, left, h, w, value in boxes:
        region = row[:, top:top + h, left:left + w]
        if isinstance(region, np.ndarray):
            region[...] = value
        else:
            import torch

            region.copy_(torch.as_tensor(value).to(region.dtype).expand(region.shape))
    return row


def _pair(value: Any, name: str) -> tuple[float, float]:
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ValueError(f"`{name}` must be a (min, max) pair. Found: {shorten(value)}.")
    lo, hi = (check_number(v, name, 0) for v in value)
    if lo > hi:
        raise ValueError(f"`{name}` must be (min, max) with min <= max. Found: {shorten(value)}.")
    return lo, hi


@dataclass(frozen=True)
class RandomErasing(FloatRowOp):
    """torchvision's ``RandomErasing(p, scale, ratio, value)`` (10 tries for a box that fits
    strictly inside; none fits: nothing erased)."""

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: Any = 0.0
    name = "RandomErasing"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))
        object.__setattr__(self, "scale", _pair(self.scale, "scale"))
        lo, hi = _pair(self.ratio, "ratio")
        if lo <= 0:
            raise ValueError(f"`ratio` must be > 0. Found: {shorten(self.ratio)}.")
        object.__setattr__(self, "ratio", (lo, hi))
        value = self.value
        if isinstance(value, str):
            if value != "random":
                raise ValueError(f"`value` must be a number, 3 numbers or 'random'. Found: {value!r}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        elif isinstance(value, (tuple, list)) and len(value) in (1, 3):
            value = tuple(check_number(v, "value") for v in value)
        else:
            raise ValueError(f"`value` must be a number, 3 numbers or 'random'. Found: {shorten(value)}.")
        object.__setattr__(self, "value", value)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        if not rng.random() < self.p:
            return ()
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            erase_area = area * float(rng.uniform(self.scale[0], self.scale[1]))
            aspect = math.exp(float(rng.uniform(log_lo, log_hi)))
            h = int(round(math.sqrt(erase_area * aspect)))
            w = int(round(math.sqrt(erase_area / aspect)))
            if not (h < height and w < width):
                continue
            if self.value == "random":
                value = rng.standard_normal((3, h, w), dtype=np.float32)
            else:
                value = np.asarray(self.value, np.float32).reshape(-1, 1, 1)
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return ((top, left, h, w, value),)
        return ()

    def apply(self, row: Any, params: Any) -> Any:
        return erase(row, params)


@dataclass(frozen=True)
class TimmRandomErasing(FloatRowOp):
    """timm's ``RandomErasing(probability, min_area, max_area, min_aspect, max_aspect, mode,
    min_count, max_count)`` on one row (``num_splits`` and ``device`` are batch settings of
    timm's that do not change a row's draw)."""

    probability: float = 0.5
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float | None = None
    mode: str = "const"
    min_count: int = 1
    max_count: int | None = None
    name = "RandomErasing(timm)"

    def __post_init__(self) -> None:
        object.__setattr__(self, "probability", check_p(self.probability, "probability"))
        _pair((self.min_area, self.max_area), "min_area/max_area")
        check_number(self.min_aspect, "min_aspect", 1e-9)
        if self.max_aspect is not None:
            check_number(self.max_aspect, "max_aspect", 1e-9)
        mode = str(self.mode or "const").lower()
        if mode not in ("const", "rand", "pixel"):
            raise ValueError(f"`mode` must be 'const', 'rand' or 'pixel'. Found: {shorten(self.mode)}.")
        object.__setattr__(self, "mode", mode)
        check_int(self.min_count, "min_count", 1)
        if self.max_count is not None:
            check_int(self.max_count, "max_count", self.min_count)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        if rng.random() > self.probability:
            return ()
        area = height * width
        max_aspect = self.max_aspect or 1 / self.min_aspect
        log_lo, log_hi = math.log(self.min_aspect), math.log(max_aspect)
        top_count = self.max_count or self.min_count
        count = self.min_count if self.min_count == top_count else int(
            rng.integers(self.min_count, top_count + 1))
        boxes = []
        for _ in range(count):
            for _attempt in range(10):
                target = float(rng.uniform(self.min_area, self.max_area)) * area / count
                aspect = math.exp(float(rng.uniform(log_lo, log_hi)))
                h = int(round(math.sqrt(target * aspect)))
                w = int(round(math.sqrt(target / aspect)))
                if w < width and h < height:
                    top = int(rng.integers(0, height - h + 1))
                    left = int(rng.integers(0, width - w + 1))
                    if self.mode == "pixel":
                        value = rng.standard_normal((3, h, w), dtype=np.float32)
                    elif self.mode == "rand":
                        value = rng.standard_normal((3, 1, 1), dtype=np.float32)
                    else:
                        value = np.zeros((3, 1, 1), np.float32)
                    boxes.append((top, left, h, w, value))
                    break
        return tuple(boxes)

    def apply(self, row: Any, params: Any) -> Any:
        return erase(row, params)
