"""Affine warps of one uint8 (H, W, 3) row as PIL's ``Image.transform(AFFINE)`` computes them.

A warp is given as PIL gives it: the inverse matrix (a, b, c, d, e, f) that maps the centre of
output pixel (x + 0.5, y + 0.5) to the input position (a x' + b y' + c, d x' + e y' + f), in
PIL's coordinates (pixel i spans [i, i + 1)). Nearest-neighbour reads input pixel
floor(position), fill outside. ``cv2.warpAffine`` (inverse map) samples at index coordinates
(pixel i centred at i) and rounds for INTER_NEAREST: shifting the matrix by half a pixel on both
sides makes the two the same sampling. PIL steps through the output in 16.16 fixed point, so
for nearest-neighbour the steps and the start are rounded to 1/65536 as PIL rounds them: without
it a shear of 0.2 (positions landing on pixel edges, which PIL's rounded step drifts off)
differed from PIL in 12-18% of the pixels; with it in none of our test warps.

:func:`affine_matrix` is torchvision's inverse matrix for ``F.affine`` on PIL images,
:func:`rotate_matrix` PIL's ``Image.rotate`` (what ``F.rotate`` calls on PIL images).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["INTERPOLATIONS", "affine_matrix", "rotate_expanded", "rotate_matrix", "warp"]

Matrix = tuple[float, float, float, float, float, float]

#: interpolation name -> OpenCV flag name
INTERPOLATIONS = {"nearest": "INTER_NEAREST", "bilinear": "INTER_LINEAR", "bicubic": "INTER_CUBIC"}


def warp(row: np.ndarray, matrix: Matrix, fill: Sequence[int], interpolation: str = "nearest",
         size: tuple[int, int] | None = None) -> np.ndarray:
    """``row`` warped by the PIL inverse ``matrix`` (module docstring) into ``size`` (H, W; the
    row's by default); pixels from outside the row are ``fill`` (R, G, B). Returns a new array
    (warps cannot run in place)."""
    import cv2

    a, b, c, d, e, f = matrix
    x0, y0 = a * 0.5 + b * 0.5 + c, d * 0.5 + e * 0.5 + f  # input position of pixel (0, 0)
    if interpolation == "nearest":  # PIL's 16.16 fixed point: its steps and start, rounded
        a, b, d, e, x0, y0 = (math.floor(v * 65536.0 + 0.5) / 65536.0 for v in (a, b, d, e, x0, y0))
    m = np.array([[a, b, x0 - 0.5], [d, e, y0 - 0.5]], np.float64)
    flags = getattr(cv2, INTERPOLATIONS[interpolation]) | cv2.WARP_INVERSE_MAP
    h, w = row.shape[:2] if size is None else size
    return cv2.warpAffine(row, m, (w, h), flags=flags, borderMode=cv2.BORDER_CONSTANT,
                          borderValue=tuple(float(v) for v in fill))


def affine_matrix(center: Sequence[float], angle: float, translate: Sequence[float],
                  scale: float, shear: Sequence[float]) -> Matrix:
    """torchvision's ``_get_inverse_affine_matrix`` (degrees; ``center`` in PIL coordinates)."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return (m[0], m[1], m[2], m[3], m[4], m[5])


def rotate_matrix(angle: float, height: int, width: int, center: Sequence[float] | None = None) -> Matrix:
    """PIL's ``Image.rotate(angle, center=center)`` (degrees, counter-clockwise, about the
    centre by default) as an inverse matrix."""
    cx, cy = (width / 2.0, height / 2.0) if center is None else (float(center[0]), float(center[1]))
    r = -math.radians(angle % 360.0)
    a, b = round(math.cos(r), 15), round(math.sin(r), 15)
    d, e = round(-math.sin(r), 15), round(math.cos(r), 15)
    c = a * -cx + b * -cy + cx
    f = d * -cx + e * -cy + cy
    return (a, b, c, d, e, f)


def rotate_expanded(matrix: Matrix, height: int, width: int) -> tuple[Matrix, tuple[int, int]]:
    """PIL's ``Image.rotate(..., expand=True)``: the rotation's inverse ``matrix`` moved so that
    the whole rotated image fits, and the output (H, W) that holds it."""
    a, b, c, d, e, f = matrix
    xs, ys = zip(*((a * x + b * y + c, d * x + e * y + f)
                   for x, y in ((0, 0), (width, 0), (width, height), (0, height))))
    nw = math.ceil(max(xs)) - math.floor(min(xs))
    nh = math.ceil(max(ys)) - math.floor(min(ys))
    tx, ty = -(nw - width) / 2.0, -(nh - height) / 2.0
    return (a, b, a * tx + b * ty + c, d, e, d * tx + e * ty + f), (nh, nw)
