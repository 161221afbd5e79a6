"""Image-only joint ops: ``RandomPhotometricDistort`` (torchvision v2's, SSD's colour
distortion) and :class:`ImageOnly`, which runs any gpufeed uint8 row op
(:mod:`gpufeed.image.augment`: ``ColorJitter``, ``RandomGrayscale``, ``GaussianBlur``, ...) on the
image of a joint sample. Targets are left as they are.

The pixels are gpufeed's uint8 colour functions (:mod:`gpufeed.image.augment._functional`),
which compute what torchvision's ``adjust_*`` compute on PIL images.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment import _functional as fn
from gpufeed.image.augment._base import RowOp
from gpufeed.image.augment._ops import ColorJitter
from gpufeed.image.detection._sample import ImageWindow, JointOp, PixelOp, Sample

__all__ = ["ImageOnly", "RandomPhotometricDistort"]

_FACTORS = ("brightness", "contrast", "saturation", "hue")


def _range(value: Any, name: str, lo: float, hi: float) -> tuple[float, float]:
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        and math.isfinite(float(v)) for v in value)
    if not ok or not lo <= float(value[0]) <= float(value[1]) <= hi:
        raise ValueError(f"`{name}` must be a (min, max) pair with {lo} <= min <= max <= {hi}. "
                         f"Found: {shorten(value)}.")
    return (float(value[0]), float(value[1]))


def _writable(image: np.ndarray) -> np.ndarray:
    """The image as the row functions need it: C-contiguous (H, W, 3) uint8 they may write."""
    if image.flags.c_contiguous and image.flags.writeable:
        return image
    return np.array(image, order="C")


def _permute_channels(image: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    """The (H, W, 3) uint8 image with channel ``k`` taken from channel ``perm[k]``, written in
    place: the planes split out then merged back (0.2 ms for 560 x 560, against 1.3 ms for
    ``image[..., perm]``)."""
    import cv2

    planes = cv2.split(image)
    result = cv2.merge([planes[i] for i in perm], dst=image)
    if result is not image:
        np.copyto(image, result)
    return image


@dataclass(frozen=True)
class RandomPhotometricDistort(JointOp):
    """torchvision v2's ``RandomPhotometricDistort``: each of brightness, contrast, saturation and
    hue is applied with probability ``p``, its factor uniform in its (min, max) range; contrast
    goes before saturation/hue or after them (even odds); then, with probability ``p``, the
    channels are permuted (uniform permutation). ``params``: torchvision's ``make_params`` dict
    (``*_factor`` None where not applied, ``contrast_before``, ``channel_permutation`` a tuple
    or None); None when nothing applies."""

    brightness: Any = (0.875, 1.125)
    contrast: Any = (0.5, 1.5)
    saturation: Any = (0.5, 1.5)
    hue: Any = (-0.05, 0.05)
    p: float = 0.5
    name = "RandomPhotometricDistort"

    def __post_init__(self) -> None:
        for which in _FACTORS[:3]:
            object.__setattr__(self, which, _range(getattr(self, which), which, 0.0, math.inf))
        object.__setattr__(self, "hue", _range(self.hue, "hue", -0.5, 0.5))
        p = self.p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"`p` must be a probability in [0, 1]. Found: {shorten(p)}.")
        object.__setattr__(self, "p", float(p))

    def draw(self, rng: np.random.Generator, sample: Sample) -> dict[str, Any] | None:
        params: dict[str, Any] = {}
        for which in _FACTORS:  # torchvision's order: the coin, then the factor if it came up
            lo, hi = getattr(self, which)
            params[f"{which}_factor"] = float(rng.uniform(lo, hi)) if rng.random() < self.p else None
        params["contrast_before"] = bool(rng.random() < 0.5)
        perm = tuple(int(i) for i in rng.permutation(3)) if rng.random() < self.p else None
        params["channel_permutation"] = perm
        if perm is None and all(params[f"{w}_factor"] is None for w in _FACTORS):
            return None
        return params

    def apply(self, sample: Sample, params: dict[str, Any]) -> Sample:
        return point_steps(sample, _steps(params))


def point_steps(sample: Sample, steps: Sequence[tuple[str, Any]]) -> Sample:
    """``sample`` with colour ``steps`` ((name, factor or permutation), in order: the names of
    ``_POINT_FNS`` and "permute") applied to its image. Every step is a point op but contrast,
    whose grey mean is the whole image's as the steps before it leave it: those run now, on the
    whole image; the rest wait on the image window, so that only the pixels a later crop keeps go
    through them (a window with margins is built first: its fill goes through the ops too)."""
    at = next((i for i, (name, _) in enumerate(steps) if name == "contrast"), None)
    window = sample.image_window()
    if window is not None and at is None and not any(window.margins):
        return Sample.windowed(window.with_ops([_pixel_op(*step) for step in steps]), sample.target)
    image = _writable(sample.image)
    for step in steps[:at]:
        image = _pixel_op(*step)(image)
    later = [_pixel_op(*step) for step in steps[len(steps) if at is None else at + 1:]]
    if at is not None:
        later.insert(0, functools.partial(fn.contrast, factor=steps[at][1], mean=fn.grey_mean(image)))
    window = ImageWindow.over(image)
    if window is None:
        for op in later:
            image = op(image)
        return Sample(image, sample.target)
    return Sample.windowed(window.with_ops(later), sample.target)


def _steps(params: dict[str, Any]) -> list[tuple[str, Any]]:
    """The point ops ``params`` apply, in torchvision's order: (name, factor or permutation)."""
    contrast, before = params["contrast_factor"], params["contrast_before"]
    steps: list[tuple[str, Any]] = []
    if params["brightness_factor"] is not None:
        steps.append(("brightness", params["brightness_factor"]))
    if contrast is not None and before:
        steps.append(("contrast", contrast))
    if params["saturation_factor"] is not None:
        steps.append(("saturation", params["saturation_factor"]))
    if params["hue_factor"] is not None:
        steps.append(("hue", params["hue_factor"]))
    if contrast is not None and not before:
        steps.append(("contrast", contrast))
    perm = params["channel_permutation"]
    if perm is not None and tuple(perm) != (0, 1, 2):
        steps.append(("permute", tuple(perm)))
    return steps


def _pixel_op(name: str, value: Any) -> PixelOp:
    """Step ``name`` of :func:`_steps` as a point op (contrast with the grey mean of the image it
    is given: only right on the whole image)."""
    if name == "permute":
        return functools.partial(_permute_channels, perm=value)
    return functools.partial(_POINT_FNS[name], factor=value)


_POINT_FNS = {"brightness": fn.brightness, "contrast": fn.contrast, "saturation": fn.color, "hue": fn.hue}


@dataclass(frozen=True)
class ImageOnly(JointOp):
    """A gpufeed uint8 row op (:class:`~gpufeed.image.augment.RowOp`) on the image of a joint
    sample, drawing from the sample's generator; the target is left as it is. ``params``: a
    1-tuple of the row op's own (so a row op's None is still applied). ``ColorJitter``'s steps
    wait on the image window as ``RandomPhotometricDistort``'s do (:func:`point_steps`)."""

    row_op: RowOp

    def __post_init__(self) -> None:
        if not isinstance(self.row_op, RowOp):
            raise TypeError(f"`row_op` must be a gpufeed RowOp (gpufeed.image.augment). "
                            f"Found: {type(self.row_op).__name__} {shorten(self.row_op)}.")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.row_op.name

    def draw(self, rng: np.random.Generator, sample: Sample) -> tuple[Any]:
        height, width = sample.size
        return (self.row_op.draw(rng, height, width),)

    def apply(self, sample: Sample, params: tuple[Any]) -> Sample:
        if type(self.row_op) is ColorJitter:  # point ops: on the pixels a later crop keeps
            return point_steps(sample, [(_JITTER_STEPS[i], factor) for i, factor in params[0]])
        return Sample(self.row_op.apply(_writable(sample.image), params[0]), sample.target)


#: ``ColorJitter``'s op indices (its ``draw``'s) as :func:`point_steps` names.
_JITTER_STEPS = ("brightness", "contrast", "saturation", "hue")
