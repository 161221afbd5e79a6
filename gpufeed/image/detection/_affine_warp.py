"""The pixel half of the affine joint ops: torchvision's matrices, its expanded output size, and
the image and mask warps on the sampling positions of its tensor kernel
(:mod:`gpufeed.image.detection._affine` has the ops, the leaves and the measured tolerances)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpufeed.errors import shorten
from gpufeed.image.augment import _warp
from gpufeed.image.detection._fills import Fill

__all__ = ["Matrix", "affine_matrix", "expanded_size", "pil_warp_image", "warp_image", "warp_mask"]

#: a resolved fill: None (zeros, no fill channel), a number, or one number per channel
#: (a, b, c, d, e, f): x' = a x + b y + c, y' = d x + e y + f
Matrix = list[float]


# --- matrices -------------------------------------------------------------------------------

def affine_matrix(center: tuple[float, float], angle: float, translate: tuple[float, float],
                  scale: float, shear: tuple[float, float], inverted: bool = True) -> Matrix:
    """torchvision's ``_get_inverse_affine_matrix``: (a, b, c, d, e, f) with x' = a x + b y + c,
    y' = d x + e y + f; ``inverted`` maps output to input positions, else input to output.
    Degrees; ``center`` and ``translate`` in pixels."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy, tan_sx = math.cos(sy), math.tan(sx)
    a = math.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot - sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    if inverted:
        m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
        m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
        m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    else:
        m = [a * scale, b * scale, 0.0, c * scale, d * scale, 0.0]
        m[2] += cx + tx - m[0] * cx - m[1] * cy
        m[5] += cy + ty - m[3] * cx - m[4] * cy
    return m


def expanded_size(matrix: Matrix, width: int, height: int) -> tuple[int, int]:
    """torchvision's ``_compute_affine_output_size`` (its tensor form, float32): (W, H) of the
    output that holds the whole warped image."""
    import torch

    hw, hh = 0.5 * width, 0.5 * height
    pts = torch.tensor([[-hw, -hh, 1.0], [-hw, hh, 1.0], [hw, hh, 1.0], [hw, -hh, 1.0]])
    theta = torch.tensor(matrix, dtype=torch.float).view(2, 3)
    lo, hi = torch.matmul(pts, theta.T).aminmax(dim=0)
    halfs = torch.tensor((hw, hh))
    lo, hi = lo + halfs, hi + halfs
    tol = 1e-4
    cmax = hi.mul(1.0 / tol).trunc().mul(tol).ceil()
    cmin = lo.mul(1.0 / tol).trunc().mul(tol).floor()
    size = cmax - cmin
    return int(size[0]), int(size[1])


# --- the warps ------------------------------------------------------------------------------

def _cv2_matrix(matrix: Matrix, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """torchvision's grid (output pixel centres about the output's centre, through the inverse
    ``matrix``, about the input's centre) as an OpenCV inverse map in index coordinates."""
    a, b, c, d, e, f = matrix
    (h, w), (oh, ow) = in_hw, out_hw
    ox, oy = (ow - 1) * 0.5, (oh - 1) * 0.5
    return np.array([[a, b, c + (w - 1) * 0.5 - a * ox - b * oy],
                     [d, e, f + (h - 1) * 0.5 - d * ox - e * oy]], np.float64)


def _image_fill(fill: Fill) -> tuple[float, float, float]:
    if fill is None:
        return (0.0, 0.0, 0.0)
    if isinstance(fill, tuple):
        if len(fill) not in (1, 3):
            raise ValueError(f"`fill` for the image must be a number or 3 numbers (R, G, B). "
                             f"Found: {shorten(fill)}.")
        return (fill * 3)[:3] if len(fill) == 1 else fill  # type: ignore[return-value]
    return (float(fill),) * 3


def _axis_aligned(matrix: Matrix) -> bool:
    a, b, _, d, e, _ = matrix
    return (abs(b) < 1e-9 and abs(d) < 1e-9) or (abs(a) < 1e-9 and abs(e) < 1e-9)


def warp_image(image: np.ndarray, matrix: Matrix, out_hw: tuple[int, int], interpolation: str,
               fill: Fill) -> np.ndarray:
    """The (H, W, 3) uint8 image through the centred inverse ``matrix`` (torchvision's
    ``affine_image`` convention) into ``out_hw``, ``fill`` outside."""
    import cv2

    flags = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR,
             "bicubic": cv2.INTER_CUBIC}[interpolation] | cv2.WARP_INVERSE_MAP
    if interpolation == "nearest" and _axis_aligned(matrix):
        # quarter turns and plain scales put output pixels on exact half-pixel ties, which
        # OpenCV and torch round apart: torchvision's own grid and rounding decide them
        planes = warp_mask(np.ascontiguousarray(image.transpose(2, 0, 1)), matrix, out_hw,
                           _image_fill(fill) if fill is not None else None)
        return np.ascontiguousarray(planes.transpose(1, 2, 0))
    m = _cv2_matrix(matrix, image.shape[:2], out_hw)
    size = (out_hw[1], out_hw[0])
    src = np.ascontiguousarray(image)
    if interpolation == "nearest" or fill is None:
        return cv2.warpAffine(src, m, size, flags=flags, borderMode=cv2.BORDER_CONSTANT,
                              borderValue=_image_fill(fill))
    # torchvision's tensor kernel: the image sampled with zeros outside (s), the share of the
    # kernel inside (m) sampled alike, then (s - fill) m + fill: the pixels along the warped
    # image's edge (0 < m < 1) count m twice, where OpenCV's border gives s + fill (1 - m).
    # Only that band is redone, from OpenCV's rounded value (one level off in a few of them).
    colour = _image_fill(fill)
    out = cv2.warpAffine(src, m, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=colour)
    inside = cv2.warpAffine(np.ones(src.shape[:2], np.float32), m, size, flags=flags,
                            borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
    band = (inside > 0) & (inside < 1)
    if band.any():
        c = np.asarray(colour, np.float32)
        share = inside[band][:, None]
        sampled = out[band].astype(np.float32) - c * (1 - share)  # s
        out[band] = np.rint((sampled - c) * share + c).clip(0, 255).astype(np.uint8)
    return out


def _torch_grid(matrix: Matrix, in_hw: tuple[int, int], out_hw: tuple[int, int], dtype: Any = None) -> Any:
    """torchvision's ``_affine_grid``: normalised input positions of the output pixels, in
    ``dtype`` (torchvision's: the image's if floating, else float32)."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    (h, w), (oh, ow) = in_hw, out_hw
    theta = torch.tensor(matrix, dtype=dtype).reshape(1, 2, 3)
    base = torch.empty(1, oh, ow, 3, dtype=dtype)
    base[..., 0].copy_(torch.linspace((1.0 - ow) * 0.5, (ow - 1.0) * 0.5, steps=ow))
    base[..., 1].copy_(torch.linspace((1.0 - oh) * 0.5, (oh - 1.0) * 0.5, steps=oh).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * w, 0.5 * h], dtype=dtype))
    return base.view(1, oh * ow, 3).bmm(rescaled).view(1, oh, ow, 2)


def warp_mask(planes: np.ndarray, matrix: Matrix, out_hw: tuple[int, int], fill: Fill) -> np.ndarray:
    """(N, H, W) planes resampled nearest on torchvision's grid, ``fill`` outside (None: 0), as
    torchvision's ``_apply_grid_transform`` does it (values through float32, as there); (N, oh,
    ow) of the planes' dtype. Integer planes: ``grid_sample`` picks the source pixel of each
    output pixel once (from an image of pixel numbers), then every plane is gathered, so N
    planes cost one plane's resampling and no float copy of the planes."""
    import torch
    from torch.nn.functional import grid_sample

    n, h, w = planes.shape
    if isinstance(fill, tuple) and len(fill) > 1 and len(fill) != n:
        raise ValueError(f"`fill` for a mask of {n} plane(s) must be a number or {n} numbers "
                         f"(torchvision refuses it too). Found: {shorten(fill)}.")
    if planes.size == 0:
        return np.zeros((n, *out_hw), planes.dtype)
    if planes.dtype.kind == "f" or h * w >= 1 << 24:  # pixel numbers exact in float32 below 2^24
        return _warp_planes(planes, matrix, out_hw, fill)
    grid = _torch_grid(matrix, (h, w), out_hw)
    numbers = torch.arange(1, h * w + 1, dtype=torch.float32).view(1, 1, h, w)
    picked = grid_sample(numbers, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    source = picked[0, 0].numpy().astype(np.int64)  # 0: outside, else 1 + the flat source index
    out = planes.reshape(n, h * w)[:, np.maximum(source - 1, 0)]
    if planes.dtype.kind in "iu" and planes.dtype.itemsize >= 4:
        out = out.astype(np.float32).astype(planes.dtype)  # torchvision's trip through float32
    outside = source == 0
    if outside.any():
        values = np.asarray(fill if isinstance(fill, tuple) else [0.0 if fill is None else fill], np.float32)
        levels = np.rint(values).astype(planes.dtype)
        if len(levels) == 1:
            out[:, outside] = levels[0]
        else:
            out[:, outside] = levels[:, None]
    return out


def _warp_planes(planes: np.ndarray, matrix: Matrix, out_hw: tuple[int, int], fill: Fill) -> np.ndarray:
    """:func:`warp_mask` as torchvision computes it: all planes through ``grid_sample``."""
    import torch
    from torch.nn.functional import grid_sample

    n, h, w = planes.shape
    src = torch.from_numpy(np.ascontiguousarray(planes))
    dtype = src.dtype if src.is_floating_point() else torch.float32
    grid = _torch_grid(matrix, (h, w), out_hw, dtype)
    img = src.to(dtype)[None]
    if fill is not None:
        img = torch.cat((img, torch.ones(1, 1, h, w, dtype=dtype)), dim=1)
    out = grid_sample(img, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    if fill is not None:
        out, inside = torch.tensor_split(out, indices=(-1,), dim=-3)
        values = list(fill) if isinstance(fill, tuple) else [float(fill)]
        fill_img = torch.tensor(values, dtype=dtype).view(1, -1, 1, 1)
        out = torch.where(inside.expand_as(out) < 0.5, fill_img.expand_as(out), out)
    if not src.is_floating_point():
        out = out.round_().to(src.dtype)
    return out[0].numpy()


# --- PIL's warps (an op before the conversion to tensor) --------------------------------------

def _fixed(value: float) -> int:
    return math.floor(value * 65536.0 + 0.5)


def _pil_steps(start: float, step: float, n: int, extent: int) -> np.ndarray:
    """PIL's ``ImagingScaleAffine`` source index of each of ``n`` outputs along one axis, -1
    outside ``extent``."""
    steps = np.full(n, float(step))
    steps[:1] = start
    pos = np.add.accumulate(steps)
    index = np.where(pos < 0, -1, pos.astype(np.int64))
    return np.where(index < extent, index, -1)


def _fixed_steps(start: int, step: int, n: int, extent: int) -> np.ndarray:
    """PIL's 16.16 fixed-point source index of each of ``n`` outputs along one axis, -1
    outside ``extent``."""
    index = (start + np.arange(n, dtype=np.int64) * step) >> 16
    return np.where((index >= 0) & (index < extent), index, -1)


def _gather(image: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill: tuple[int, ...],
            swapped: bool = False) -> np.ndarray:
    """out[y, x] = image[rows[y], cols[x]] (``swapped``: image[rows[x], cols[y]]), ``fill``
    where an index is -1."""
    picked = image.take(np.maximum(rows, 0), axis=0).take(np.maximum(cols, 0), axis=1)
    picked[rows < 0] = fill
    picked[:, cols < 0] = fill
    return np.ascontiguousarray(picked.transpose(1, 0, 2)) if swapped else picked


def _pil_nearest(image: np.ndarray, matrix: Matrix, out_hw: tuple[int, int], fill: tuple[int, ...]) -> np.ndarray:
    """PIL's nearest affine transform exactly: a scale (b = d = 0) steps a float64 position per
    pixel (``ImagingScaleAffine``); any other matrix steps through the output in 16.16 fixed
    point from the centre of pixel (0, 0), and reads the pixel its truncated position falls in
    (integer steps, so the sums are the same in any order). An axis kept or swapped in 16.16
    (quarter turns) is two index vectors; a general matrix two int32 maps gathered by
    ``cv2.remap`` (outside: ``fill``)."""
    import cv2

    a, b, c, d, e, f = matrix
    (oh, ow), (h, w) = out_hw, image.shape[:2]
    if b == 0 and d == 0:
        return _gather(image, _pil_steps(f + e * 0.5, e, oh, h), _pil_steps(c + a * 0.5, a, ow, w), fill)
    fa, fb, fd, fe = (_fixed(v) for v in (a, b, d, e))
    x0, y0 = _fixed(a * 0.5 + b * 0.5 + c), _fixed(d * 0.5 + e * 0.5 + f)
    if fb == 0 and fd == 0:
        return _gather(image, _fixed_steps(y0, fe, oh, h), _fixed_steps(x0, fa, ow, w), fill)
    if fa == 0 and fe == 0:  # x from the output row, y from the output column
        return _gather(image, _fixed_steps(y0, fd, ow, h), _fixed_steps(x0, fb, oh, w), fill, swapped=True)
    rows, cols = np.arange(oh, dtype=np.int64)[:, None], np.arange(ow, dtype=np.int64)[None, :]
    maps = []
    for start, down, across, extent in ((x0, fb, fa, w), (y0, fe, fd, h)):
        row, col = start + rows * down, cols * across
        fits = int(np.abs(row).max(initial=0)) + int(np.abs(col).max(initial=0)) < 2 ** 31
        kind = np.int32 if fits else np.int64
        index = (row.astype(kind) + col.astype(kind)) >> 16
        index[(index < 0) | (index >= extent)] = -1  # remap's constant border
        maps.append(index.astype(np.float32))
    return cv2.remap(np.ascontiguousarray(image), maps[0], maps[1], cv2.INTER_NEAREST,
                     borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(float(v) for v in fill))


def pil_warp_image(image: np.ndarray, matrix: Matrix, out_hw: tuple[int, int], interpolation: str,
                   fill: Fill) -> np.ndarray:
    """The (H, W, 3) uint8 image through PIL's inverse ``matrix`` (``Image.transform(AFFINE)``'s
    convention: output pixel centres to input positions) into ``out_hw``, as torchvision's PIL
    kernels warp a PIL image, as the classification path's PIL warps (OpenCV on PIL's sampling
    positions; nearest on its 16.16 steps) or, for a nearest warp that keeps or swaps an axis,
    by PIL's own integer steps. ``fill`` truncated to integers, as torchvision gives it to PIL."""
    colour = tuple(int(v) for v in _image_fill(fill))
    if interpolation == "nearest" and 0 in (_fixed(v) for v in (matrix[0], matrix[1], matrix[3], matrix[4])):
        # an axis kept or swapped (quarter turns, scales, one-axis shears) puts positions on
        # pixel edges, where OpenCV's rounding parts from PIL's: PIL's own steps (about 10x
        # OpenCV's time); elsewhere OpenCV on PIL's 16.16 steps gives PIL's pixels
        return _pil_nearest(image, matrix, out_hw, colour)
    return _warp.warp(np.ascontiguousarray(image), tuple(matrix), colour, interpolation, out_hw)  # type: ignore[arg-type]
