"""Argument checks shared by the augmentation ops (messages name the argument, value and fix)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpufeed.errors import check_int as _check_int
from gpufeed.errors import shorten


def check_p(value: Any, name: str = "p") -> float:
    """A probability in [0, 1], as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"`{name}` must be a probability in [0, 1]. Found: {shorten(value)}.")
    return float(value)


def choice_weights(p: Any, n: int) -> tuple[float, ...] | None:
    """A ``RandomChoice``'s ``p`` for ``n`` ops as probabilities summing to 1 (None: uniform)."""
    if p is None:
        return None
    try:
        weights = tuple(float(w) for w in p)
    except (TypeError, ValueError):
        weights = ()
    if len(weights) != n or not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"`p` must be None or {n} weights >= 0 with a positive sum. Found: {shorten(p)}.")
    return tuple(w / sum(weights) for w in weights)


def check_number(value: Any, name: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number in [lo, hi], as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"`{name}` must be a number in [{lo}, {hi}]. Found: {shorten(value)}.")
    return float(value)


def check_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """An int in [lo, hi] (:func:`gpufeed.errors.check_int`, in the ops' argument order)."""
    return _check_int(name, value, lo, hi, rule=None if hi is None else f"in [{lo}, {hi}]")


def check_fill(value: Any, name: str = "fill") -> tuple[int, int, int]:
    """A fill colour: None (black), one level or three levels (0-255), as three ints."""
    if value is None:
        return (0, 0, 0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values: Sequence[Any] = (value,) * 3
    elif isinstance(value, (tuple, list)) and len(value) in (1, 3):
        values = tuple(value) * (3 if len(value) == 1 else 1)
    else:
        raise ValueError(f"`{name}` must be None, a level or three levels (R, G, B), 0-255. "
                         f"Found: {shorten(value)}.")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 255
               for v in values):
        raise ValueError(f"`{name}` levels must be numbers in [0, 255]. Found: {shorten(value)}.")
    return (int(values[0]), int(values[1]), int(values[2]))


def check_interpolation(value: Any, name: str = "interpolation") -> str:
    """"nearest", "bilinear" or "bicubic" (torchvision's InterpolationMode is taken by value)."""
    text = str(getattr(value, "value", value)).lower()
    if text not in ("nearest", "bilinear", "bicubic"):
        raise ValueError(f"`{name}` must be 'nearest', 'bilinear' or 'bicubic'. "
                         f"Found: {shorten(value)}.")
    return text


def check_range(value: Any, name: str, center: float | None, lo: float = 0.0,
                hi: float = math.inf) -> tuple[float, float] | None:
    """torchvision's ColorJitter argument: a number v gives [center - v, center + v] (clipped at
    ``lo``), a pair is (min, max); None or 0 (or (center, center)) gives None (op off)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"`{name}` must be >= 0 when a single number. Found: {shorten(value)}.")
        c = 0.0 if center is None else center
        pair = (c - float(value), c + float(value))
        if lo == 0.0:  # torchvision clips the factors' lower end at 0
            pair = (max(pair[0], 0.0), pair[1])
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = (check_number(value[0], name, lo, hi), check_number(value[1], name, lo, hi))
        if pair[0] > pair[1]:
            raise ValueError(f"`{name}` must be (min, max) with min <= max. Found: {shorten(value)}.")
    else:
        raise ValueError(f"`{name}` must be a number or a (min, max) pair. Found: {shorten(value)}.")
    if not (lo <= pair[0] and pair[1] <= hi):
        raise ValueError(f"`{name}` must lie in [{lo}, {hi}]. Found: {shorten(value)}.")
    if pair[0] == pair[1] == (0.0 if center is None else center):
        return None
    return pair
