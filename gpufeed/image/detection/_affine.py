"""``RandomAffine`` and ``RandomRotation`` as joint ops, with torchvision v2's geometry.

The forward and inverse matrices are torchvision's ``_get_inverse_affine_matrix`` (angle in
degrees, counter-clockwise for ``rotate``; shear in degrees). Boxes: the four corners of each
box go through the forward matrix, the enclosing box is taken, shifted for ``expand`` and
clamped per the leaf's ``clamping_mode`` (``affine_bounding_boxes``). Keypoints: the forward
matrix, never clamped. Masks are materialised and resampled as torchvision does it
(``grid_sample``, nearest, on torchvision's own grid, in torch), so they equal ``affine_mask``
/ ``rotate_mask`` pixel for pixel. The image: ``cv2.warpAffine`` on the sampling positions of
torchvision's tensor kernel (nearest: 0.01% of the pixels differ at most, on rounding ties;
bilinear: 0.004 levels on average at most, on the band along the warped edge where torchvision
blends the fill), and nearest axis-aligned warps (half-pixel ties everywhere) on torchvision's
grid. ``rotate`` about the centre by a multiple of 90 degrees is ``rot90`` for the image and
masks, as in torchvision. torchvision's quirks are kept: with ``expand`` the boxes' canvas may
be a pixel off the image's (each rounds its own matrix), and empty boxes or keypoints keep
their canvas.

``fill`` is resolved per leaf by type NAME (``"Image"``, ``"Mask"``, else ``"others"``), so a
torchvision dict keyed by ``tv_tensors.Image`` / ``tv_tensors.Mask`` works as given. (In
torchvision a PIL image is not a ``tv_tensors.Image``: it takes the ``"others"`` fill; a
translation from a PIL pipeline should drop the ``Image`` key.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment import _warp as pil_matrix
from gpufeed.image.detection._affine_warp import (
    Matrix,
    affine_matrix,
    expanded_size,
    pil_warp_image,
    warp_image,
    warp_mask,
)
from gpufeed.image.detection._boxes import from_xyxy, to_xyxy
from gpufeed.image.detection._fills import Fill, fill_for, setup_fill
from gpufeed.image.detection._sample import (
    Boxes,
    JointOp,
    KeyPoints,
    Mask,
    Sample,
    is_integer_dtype,
    map_leaves,
)

__all__ = ["RandomAffine", "RandomRotation", "check_interpolation"]

#: torchvision's ``InterpolationMode`` ints (PIL's constants) -> name
_INTERP_INTS = {0: "nearest", 2: "bilinear", 3: "bicubic"}
_INTERPS = ("nearest", "bilinear", "bicubic")


# --- arguments ------------------------------------------------------------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def _numbers(value: Any, name: str, sizes: tuple[int, ...]) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) not in sizes \
            or not all(_is_number(v) for v in value):
        raise ValueError(f"`{name}` must be a sequence of {' or '.join(map(str, sizes))} numbers. "
                         f"Found: {shorten(value)}.")
    return tuple(float(v) for v in value)


def _pairs_ordered(values: tuple[float, ...], name: str, given: Any) -> tuple[float, ...]:
    if any(values[i] > values[i + 1] for i in range(0, len(values), 2)):
        raise ValueError(f"`{name}` must be (min, max) pairs with min <= max. Found: {shorten(given)}.")
    return values


def _angle_range(value: Any, name: str, sizes: tuple[int, ...] = (2,)) -> tuple[float, ...]:
    """torchvision's ``_setup_angle``: a number d >= 0 is (-d, d), else a sequence of ``sizes``."""
    if _is_number(value):
        if value < 0:
            raise ValueError(f"`{name}` must be >= 0 when a single number. Found: {shorten(value)}.")
        return (-float(value), float(value))
    return _pairs_ordered(_numbers(value, name, sizes), name, value)


def check_interpolation(value: Any) -> str:
    """"nearest", "bilinear" or "bicubic" from a name, torchvision's ``InterpolationMode`` (by
    value) or PIL's int constant."""
    if isinstance(value, int) and not isinstance(value, bool) and value in _INTERP_INTS:
        return _INTERP_INTS[value]
    text = str(getattr(value, "value", value)).lower()
    if text not in _INTERPS:
        raise ValueError(f"`interpolation` must be one of {', '.join(_INTERPS)} (an "
                         f"InterpolationMode or its name). Found: {shorten(value)}.")
    return text


# --- the leaves -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Geometry:
    """One draw's warp: torchvision's ``affine`` arguments, plus ``expand`` for ``rotate``."""

    angle: float
    translate: tuple[float, float]
    scale: float
    shear: tuple[float, float]
    center: tuple[float, float] | None
    expand: bool = False
    pixel_angle: float | None = None  # the image's and masks' angle where it differs (rotate)
    rot90: bool = False  # rotate's quarter-turn fast path for the image and masks

    def forward(self, hw: tuple[int, int]) -> tuple[Matrix, tuple[int, int], np.ndarray]:
        """(forward matrix about ``center`` in pixels, output (H, W), shift subtracted for
        ``expand``) on a canvas of ``hw`` (the boxes' and keypoints' rule)."""
        h, w = hw
        center = (w * 0.5, h * 0.5) if self.center is None else self.center
        fwd = affine_matrix(center, self.angle, self.translate, self.scale, self.shear, inverted=False)
        shift = np.zeros(2)
        if not self.expand:
            return fwd, hw, shift
        corners = np.array([[0.0, 0.0], [0.0, h], [w, h], [w, 0.0]])
        shift = _apply(corners, fwd).min(axis=0)
        inv = affine_matrix(center, self.angle, self.translate, self.scale, self.shear)
        ow, oh = expanded_size(inv, w, h)
        return fwd, (oh, ow), shift

    def inverse(self, hw: tuple[int, int]) -> tuple[Matrix, tuple[int, int]]:
        """(inverse matrix about the image centre, output (H, W)): the image's and masks' rule."""
        h, w = hw
        center = (0.0, 0.0) if self.center is None else (self.center[0] - w * 0.5, self.center[1] - h * 0.5)
        angle = self.angle if self.pixel_angle is None else self.pixel_angle
        inv = affine_matrix(center, angle, self.translate, self.scale, self.shear)
        if not self.expand:
            return inv, hw
        ow, oh = expanded_size(inv, w, h)
        return inv, (oh, ow)


def _apply(points: np.ndarray, m: Matrix) -> np.ndarray:
    x, y = points[..., 0], points[..., 1]
    return np.stack([m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]], axis=-1)


def _forward_float32(geo: _Geometry, hw: tuple[int, int]) -> tuple[Any, tuple[int, int], Any]:
    """(transposed forward matrix, output (H, W), the expand shift as a (1, 2) tensor or None),
    float32 torch tensors, as torchvision builds them for an integer leaf (which it casts to
    float32 first)."""
    import torch

    fwd, canvas, _ = geo.forward(hw)
    matrix = torch.tensor(fwd, dtype=torch.float32).reshape(2, 3).T
    if not geo.expand:
        return matrix, canvas, None
    h, w = hw
    corners = torch.tensor([[0.0, 0.0, 1.0], [0.0, float(h), 1.0], [float(w), float(h), 1.0],
                            [float(w), 0.0, 1.0]], dtype=torch.float32)
    return matrix, canvas, torch.amin(torch.matmul(corners, matrix), dim=0, keepdim=True)


def _homogeneous(points: Any) -> Any:
    import torch

    return torch.cat([points, torch.ones(points.shape[0], 1, dtype=points.dtype)], dim=-1)


def _warp_float32_boxes(boxes: Boxes, geo: _Geometry) -> Boxes:
    """``warp_boxes`` for float32 and integer boxes, computed as torchvision computes them: (an
    integer leaf cast to float32,) torch's float32 matmul, clamped and converted back in
    float32, (an integer leaf cast back, towards zero). In float64 a corner that lands on a
    whole number (quarter turns, flips by shear 0) can fall on the other side of it, and the
    cast then moves the box by a pixel; a float32 box on the canvas' edge can land on the
    other side of it, and ``SanitizeBoundingBoxes`` then decides otherwise."""
    import torch

    matrix, canvas, shift = _forward_float32(geo, boxes.canvas)
    # integer leaves: whole numbers and halves (CXCYWH), so the float32 conversion is exact
    xyxy = torch.from_numpy(to_xyxy(boxes.data, boxes.format, "float32").astype(np.float32))
    corners = xyxy[:, [[0, 1], [2, 1], [2, 3], [0, 3]]].reshape(-1, 2)
    lo, hi = torch.aminmax(torch.matmul(_homogeneous(corners), matrix).reshape(-1, 4, 2), dim=1)
    out = torch.cat([lo, hi], dim=1)
    if shift is not None:
        out.sub_(shift.repeat((1, 2)))
    if boxes.clamping_mode is not None:
        out[:, 0::2].clamp_(min=0, max=canvas[1])
        out[:, 1::2].clamp_(min=0, max=canvas[0])
    if boxes.format != "XYXY":  # torchvision's in-place float conversions, op for op
        out[:, 2:].sub_(out[:, :2])
        if boxes.format == "CXCYWH":
            out[:, :2].mul_(2).add_(out[:, 2:]).div_(2)
    data = (out.to(torch.int64) if is_integer_dtype(boxes.dtype) else out).numpy().astype(np.float64)
    return Boxes(data, boxes.format, canvas, boxes.clamping_mode, boxes.dtype)


def warp_boxes(boxes: Boxes, geo: _Geometry) -> Boxes:
    """torchvision's ``_affine_bounding_boxes_with_expand`` for axis-aligned formats: an empty
    leaf comes back as it is (its canvas too, as torchvision leaves it)."""
    if boxes.data.size == 0:
        return boxes
    if is_integer_dtype(boxes.dtype) or boxes.dtype == "float32":
        return _warp_float32_boxes(boxes, geo)
    fwd, canvas, shift = geo.forward(boxes.canvas)
    xyxy = to_xyxy(boxes.data, boxes.format)
    corners = xyxy[:, [[0, 1], [2, 1], [2, 3], [0, 3]]]  # (N, 4 corners, 2)
    moved = _apply(corners, fwd)
    out = np.concatenate([moved.min(axis=1), moved.max(axis=1)], axis=1)
    out -= np.tile(shift, 2)
    if boxes.clamping_mode is not None:  # soft and hard are the same for axis-aligned boxes
        out[:, 0::2] = out[:, 0::2].clip(0, canvas[1])
        out[:, 1::2] = out[:, 1::2].clip(0, canvas[0])
    data = from_xyxy(out, boxes.format)
    return Boxes(data, boxes.format, canvas, boxes.clamping_mode, boxes.dtype)


def warp_keypoints(points: KeyPoints, geo: _Geometry) -> KeyPoints:
    """torchvision's ``_affine_keypoints_with_expand`` (not clamped; an empty leaf unchanged)."""
    if points.data.size == 0:
        return points
    if is_integer_dtype(points.dtype) or points.dtype == "float32":  # as _warp_float32_boxes
        import torch

        matrix, canvas, shift32 = _forward_float32(geo, points.canvas)
        flat = torch.from_numpy(points.data.astype(np.float32).reshape(-1, 2))
        moved = torch.matmul(_homogeneous(flat), matrix).reshape(points.data.shape)
        if shift32 is not None:
            moved.sub_(shift32)
        data = (moved.to(torch.int64) if is_integer_dtype(points.dtype) else moved).numpy().astype(np.float64)
        return KeyPoints(data, canvas, points.dtype)
    fwd, canvas, shift = geo.forward(points.canvas)
    data = _apply(points.data, fwd) - shift
    return KeyPoints(data, canvas, points.dtype)


def _rot90_k(geo: _Geometry, hw: tuple[int, int]) -> int | None:
    """torchvision's ``rotate_image`` fast path: k quarter turns (counter-clockwise), or None."""
    if not geo.rot90 or geo.center is not None or geo.pixel_angle is None:
        return None
    turn = -geo.pixel_angle
    if turn in (0, 180):
        return int(turn // 90)
    if turn in (90, 270) and (geo.expand or hw[0] == hw[1]):
        return int(turn // 90)
    return None


def _warp_mask_leaf(mask: Mask, geo: _Geometry, fill: Fill) -> Mask:
    k = _rot90_k(geo, mask.size)
    if k == 0:
        return mask
    if k == 2:  # a half turn is a selection: the mask stays lazy
        h, w = mask.size
        mask.select(np.arange(h - 1, -1, -1), np.arange(w - 1, -1, -1))
        return mask
    data = mask.materialize()
    planes = data if mask.planes else data[None]
    if k is not None:
        out = np.ascontiguousarray(np.rot90(planes, k=k, axes=(-2, -1)))
    else:
        inv, out_hw = geo.inverse(planes.shape[-2:])
        out = warp_mask(planes, inv, out_hw, fill)
    return Mask(data=out if mask.planes else out[0])


def _warp_sample(sample: Sample, geo: _Geometry, interpolation: str, fills: dict[str, Fill],
                 pil: tuple[Matrix, tuple[int, int]] | None = None) -> Sample:
    """The warp of the image and every leaf; ``pil``: (PIL's inverse matrix, output (H, W)) for
    an op given torchvision's PIL image, which PIL warps (masks, boxes and keypoints are tensors
    in torchvision there too)."""
    k = _rot90_k(geo, sample.size)  # PIL's rotate takes the same quarter-turn shortcuts
    if k is not None:
        image = np.ascontiguousarray(np.rot90(sample.image, k=k, axes=(0, 1)))
    elif pil is not None:
        image = pil_warp_image(sample.image, pil[0], pil[1], interpolation, fill_for(fills, "Image"))
    else:
        inv, out_hw = geo.inverse(sample.size)
        image = warp_image(sample.image, inv, out_hw, interpolation, fill_for(fills, "Image"))
    mask_fill = fill_for(fills, "Mask")

    def leaf(value: Any) -> Any:
        if isinstance(value, Boxes):
            return warp_boxes(value, geo)
        if isinstance(value, KeyPoints):
            return warp_keypoints(value, geo)
        if isinstance(value, Mask):
            return _warp_mask_leaf(value, geo, mask_fill)
        return value

    return Sample(image, map_leaves(sample.target, leaf))


# --- the ops --------------------------------------------------------------------------------

def _check_center(center: Any) -> tuple[float, float] | None:
    if center is None:
        return None
    values = _numbers(center, "center", (2,))
    return (values[0], values[1])


@dataclass(frozen=True)
class RandomAffine(JointOp):
    """torchvision v2's ``RandomAffine``: angle uniform in ``degrees`` (d: [-d, d]); shift
    round(uniform(-tx W, tx W)) px (and so for y) for ``translate`` = (tx, ty) in [0, 1]; scale
    uniform in ``scale`` (min, max); x shear uniform in ``shear``'s first pair (s: [-s, s]), y
    shear in its second if given (degrees). ``fill``: a number, a tuple, or a dict by type name
    (``"Image"``, ``"Mask"``, ``"others"``). ``center``: (x, y) px, None the image centre.
    ``params``: torchvision's ``make_params`` dict (angle, translate, scale, shear)."""

    degrees: Any = 0
    translate: Any = None
    scale: Any = None
    shear: Any = None
    interpolation: Any = "nearest"
    fill: Any = field(default=0, hash=False)
    center: Any = None
    pil: bool = False  # given torchvision's PIL image (before the conversion to tensor)
    name = "RandomAffine"

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", _angle_range(self.degrees, "degrees"))
        if self.translate is not None:
            t = _numbers(self.translate, "translate", (2,))
            if not all(0.0 <= v <= 1.0 for v in t):
                raise ValueError(f"`translate` must be two fractions in [0, 1]. Found: {shorten(self.translate)}.")
            object.__setattr__(self, "translate", t)
        if self.scale is not None:
            s = _pairs_ordered(_numbers(self.scale, "scale", (2,)), "scale", self.scale)
            if not s[0] > 0:
                raise ValueError(f"`scale` must be positive. Found: {shorten(self.scale)}.")
            object.__setattr__(self, "scale", s)
        if self.shear is not None:
            object.__setattr__(self, "shear", _angle_range(self.shear, "shear", (2, 4)))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        object.__setattr__(self, "_fills", setup_fill(self.fill))
        object.__setattr__(self, "center", _check_center(self.center))

    def draw(self, rng: np.random.Generator, sample: Sample) -> dict[str, Any]:
        height, width = sample.size
        angle = float(rng.uniform(self.degrees[0], self.degrees[1]))
        translate = (0, 0)
        if self.translate is not None:
            dx, dy = float(self.translate[0] * width), float(self.translate[1] * height)
            translate = (int(round(float(rng.uniform(-dx, dx)))), int(round(float(rng.uniform(-dy, dy)))))
        scale = 1.0 if self.scale is None else float(rng.uniform(self.scale[0], self.scale[1]))
        shear_x = shear_y = 0.0
        if self.shear is not None:
            shear_x = float(rng.uniform(self.shear[0], self.shear[1]))
            if len(self.shear) == 4:
                shear_y = float(rng.uniform(self.shear[2], self.shear[3]))
        return {"angle": angle, "translate": translate, "scale": scale, "shear": (shear_x, shear_y)}

    def apply(self, sample: Sample, params: dict[str, Any]) -> Sample:
        t = params["translate"]
        geo = _Geometry(float(params["angle"]), (float(t[0]), float(t[1])), float(params["scale"]),
                        (float(params["shear"][0]), float(params["shear"][1])), self.center)
        pil = None
        if self.pil:  # torchvision's _affine_image_pil: its inverse matrix, the image's size
            h, w = sample.size
            center = (w * 0.5, h * 0.5) if self.center is None else self.center
            pil = (list(pil_matrix.affine_matrix(center, geo.angle, geo.translate, geo.scale, geo.shear)), (h, w))
        return _warp_sample(sample, geo, self.interpolation, self._fills, pil)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RandomRotation(JointOp):
    """torchvision v2's ``RandomRotation``: angle uniform in ``degrees`` (d: [-d, d]),
    counter-clockwise about ``center`` ((x, y) px; None: the image centre); ``expand``: the
    output holds the whole rotated image. ``fill`` as for :class:`RandomAffine`.
    ``params``: {"angle": degrees}."""

    degrees: Any = 0
    interpolation: Any = "nearest"
    expand: bool = False
    center: Any = None
    fill: Any = field(default=0, hash=False)
    pil: bool = False  # given torchvision's PIL image (before the conversion to tensor)
    name = "RandomRotation"

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", _angle_range(self.degrees, "degrees"))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        if not isinstance(self.expand, (bool, np.bool_)):
            raise TypeError(f"`expand` must be True or False. Found: {shorten(self.expand)}.")
        object.__setattr__(self, "expand", bool(self.expand))
        object.__setattr__(self, "center", _check_center(self.center))
        object.__setattr__(self, "_fills", setup_fill(self.fill))

    def draw(self, rng: np.random.Generator, sample: Sample) -> dict[str, Any]:
        return {"angle": float(rng.uniform(self.degrees[0], self.degrees[1]))}

    def apply(self, sample: Sample, params: dict[str, Any]) -> Sample:
        # torchvision's rotate is affine by -angle; rotate_image takes the angle mod 360 first
        angle = float(params["angle"])
        geo = _Geometry(-angle, (0.0, 0.0), 1.0, (0.0, 0.0), self.center, self.expand,
                        pixel_angle=-(angle % 360), rot90=True)
        pil = None
        if self.pil:  # PIL's Image.rotate, as torchvision's _rotate_image_pil calls it
            h, w = sample.size
            matrix, out_hw = pil_matrix.rotate_matrix(angle, h, w, self.center), (h, w)
            if self.expand:
                matrix, out_hw = pil_matrix.rotate_expanded(matrix, h, w)
            pil = (list(matrix), out_hw)
        return _warp_sample(sample, geo, self.interpolation, self._fills, pil)  # type: ignore[attr-defined]
