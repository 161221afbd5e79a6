"""The pixel work of the augmentations on one uint8 (H, W, 3) RGB row, as PIL computes it.

Point ops are 256-entry lookup tables (``cv2.LUT``, in place); blends are ``cv2.addWeighted``.
Definitions follow PIL's (``ImageOps``, ``ImageEnhance``), which torchvision's ops call on PIL
images and timm's policies call directly:

- a blend ``ImageEnhance.*(img).enhance(f)`` is ``trunc(d + f * (x - d))`` clipped to 0-255,
  (float32), ``d`` the op's degenerate image (black, the grey mean, the grey image, the
  smoothed image): exact lookup tables where ``d`` is one level, ``cv2.addWeighted`` per pixel
  else (one level off in 0.1% of the pixels, :func:`_blend_rows`);
- grey is OpenCV's BT.601 conversion (PIL's to one level in 0.15% of the pixels, :func:`grey`);
- ``equalize`` and ``autocontrast`` are PIL's per-channel tables from the row's histograms.

Every function takes the row and its parameters, returns the result (the row itself when it
could write in place).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["autocontrast", "blur", "box_blur_weights", "brightness", "color", "contrast", "equalize",
           "grayscale", "hue", "invert", "lut", "pil_gaussian_blur", "posterize", "sharpness",
           "solarize", "solarize_add"]

_LEVELS = np.arange(256, dtype=np.float32)
_TRUNC = -0.49  # addWeighted gamma: round(v - 0.49) is trunc(v) but within 0.01 of a half level


def lut(row: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``row`` through ``table`` (256 uint8 values, or (256, 3) per channel), in place."""
    import cv2

    if table.ndim == 2:
        table = table.reshape(1, 256, 3)
    result = cv2.LUT(row, table, dst=row)
    if result is not row:
        np.copyto(row, result)
    return row


@functools.lru_cache(maxsize=1024)
def _blend_table(degenerate: float, factor: float) -> np.ndarray:
    """PIL's ``Image.blend(constant, img, factor)`` as a table: trunc(d + f * (x - d)). Cached:
    a policy's factors are a few bins (building a table costs more than applying it)."""
    f, d = np.float32(factor), np.float32(degenerate)
    return np.clip(np.trunc(d + f * (_LEVELS - d)), 0, 255).astype(np.uint8)


def brightness(row: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Brightness(img).enhance(factor)`` (torchvision's ``adjust_brightness``)."""
    return lut(row, _blend_table(0.0, float(factor)))


def grey_mean(row: np.ndarray) -> int:
    """PIL's ``int(mean of img.convert("L") + 0.5)``, the degenerate level of ``contrast``: from
    the three channel means with PIL's grey weights (one read of the row instead of a grey
    conversion and its mean). The per-pixel rounding of PIL's grey averages out to within
    0.002 of a level on a 224 x 224 row, so the two agree but where the mean falls that close
    to a half level."""
    import cv2

    r, g, b, _ = cv2.mean(row)
    return int((19595 * r + 38470 * g + 7471 * b) / 65536.0 + 0.5)


def contrast(row: np.ndarray, factor: float, mean: int | None = None) -> np.ndarray:
    """``ImageEnhance.Contrast(img).enhance(factor)``: a blend with the grey mean (``mean``:
    that of the whole image when ``row`` is only part of it; None: ``grey_mean(row)``)."""
    level = grey_mean(row) if mean is None else mean
    return lut(row, _blend_table(float(level), float(factor)))


def _blend_rows(row: np.ndarray, degenerate: np.ndarray, factor: float) -> np.ndarray:
    """trunc(d + f * (x - d)) per pixel, into ``row``: ``cv2.addWeighted`` rounds
    f x + (1 - f) d - 0.49, which is the truncation but within 0.01 of a half level (0.1% of
    a photo's pixels, one level off). Why not PIL's float32 arithmetic in numpy: 4x the time
    (0.46-0.65 ms against 0.10-0.16 ms a 224 x 224 row, one run, loaded 2-core box)."""
    import cv2

    result = cv2.addWeighted(row, factor, degenerate, 1.0 - factor, _TRUNC, dst=row)
    if result is not row:
        np.copyto(row, result)
    return row


def grey(row: np.ndarray) -> np.ndarray:
    """``img.convert("L")`` of the row, (H, W) uint8, by ``cv2.cvtColor``: BT.601 weights in
    14-bit fixed point where PIL uses 16 bits, one level off in 0.15% of a photo's pixels. Why
    not PIL's weights through ``cv2.transform``: 8x the time (0.42-0.53 ms against 0.05-0.06 ms
    a 224 x 224 row, one run)."""
    import cv2

    return cv2.cvtColor(row, cv2.COLOR_RGB2GRAY)


def _grey3(row: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(grey(row), cv2.COLOR_GRAY2RGB)


def color(row: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Color(img).enhance(factor)`` (``adjust_saturation``): a blend with the
    grey image."""
    return _blend_rows(row, _grey3(row), factor)


def grayscale(row: np.ndarray) -> np.ndarray:
    """``img.convert("L").convert("RGB")`` (``RandomGrayscale``, ``rgb_to_grayscale(img, 3)``)."""
    np.copyto(row, _grey3(row))
    return row


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13.0


def sharpness(row: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness(img).enhance(factor)``: a blend with PIL's SMOOTH filter of the
    row, whose outermost pixels are the row's own (``adjust_sharpness``)."""
    import cv2

    if row.shape[0] <= 2 or row.shape[1] <= 2:
        return row
    smooth = cv2.filter2D(row, -1, _SMOOTH, borderType=cv2.BORDER_REPLICATE)
    smooth[0], smooth[-1], smooth[:, 0], smooth[:, -1] = row[0], row[-1], row[:, 0], row[:, -1]
    return _blend_rows(row, smooth, factor)


_HUE_STRIP = 1 << 15  # pixels per strip of :func:`hue`: its float32 temporaries stay in cache


@functools.lru_cache(maxsize=256)
def _hue_tables(shift: int) -> tuple[np.ndarray, np.ndarray]:
    """(hue, saturation) lookup tables of :func:`hue` for a hue ``shift`` (0-255): PIL's hue
    byte to the shifted hue in degrees, PIL's saturation byte to the saturation in [0, 1]
    (float32, as the per-pixel arithmetic they replace rounded them)."""
    byte = np.arange(256, dtype=np.int32)
    degrees = np.empty(256, np.float32)
    np.multiply((byte + shift) & 255, np.float32(360 / 255), out=degrees, casting="unsafe")
    saturation = np.multiply(byte.astype(np.float32), np.float32(1 / 255), dtype=np.float32)
    degrees.flags.writeable = saturation.flags.writeable = False
    return degrees, saturation


def hue(row: np.ndarray, factor: float) -> np.ndarray:
    """torchvision's ``adjust_hue`` on PIL: PIL's HSV bytes (hue and saturation truncated to
    0-255), the hue byte plus ``int(factor * 255)`` mod 256, back to RGB (rounded). ``factor``
    in [-0.5, 0.5]. Computed through OpenCV's float HSV, 0.04-0.06 levels from PIL on average
    (the byte OpenCV's uint8 HSV makes, on a 0-255 hue scale and rounded, was 1.1 levels off),
    in strips of ``_HUE_STRIP`` pixels so the float32 temporaries stay in cache; the bytes
    shift or truncate through 256-entry tables. 0.24 ms for 224 x 224 and 1.6 ms for 560 x 560
    (whole-image passes: 0.28 and 5.0 ms; PIL: 2.8 and 16 ms)."""
    import cv2

    shift = int(factor * 255) % 256
    if shift == 0:
        return row
    to_degrees, to_saturation = _hue_tables(shift)
    byte_scales = ((0, np.float32(255 / 360), to_degrees), (1, np.float32(255), to_saturation))
    step = max(1, _HUE_STRIP // max(row.shape[1], 1))
    for top in range(0, row.shape[0], step):
        strip = row[top:top + step]
        hsv = np.multiply(strip, np.float32(1 / 255), dtype=np.float32)
        cv2.cvtColor(hsv, cv2.COLOR_RGB2HSV, dst=hsv)  # H in degrees [0, 360), S, V in [0, 1]
        for channel, scale, table in byte_scales:
            plane = hsv[:, :, channel]
            plane[...] = cv2.LUT(np.multiply(plane, scale).astype(np.uint8), table)  # truncated
        cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=hsv)
        result = cv2.convertScaleAbs(hsv, dst=strip, alpha=255)  # * 255, rounded half to even
        if result is not strip:
            np.copyto(strip, result)
    return row


def gaussian_kernel(kernel_size: int, sigma: float) -> np.ndarray:
    """torchvision's 1-d kernel: exp(-x^2 / (2 sigma^2)) at x = -(k-1)/2 .. (k-1)/2, summed to 1."""
    half = (kernel_size - 1) * 0.5
    x = np.linspace(-half, half, kernel_size, dtype=np.float32)
    pdf = np.exp(-0.5 * (x / np.float32(sigma)) ** 2)
    return (pdf / pdf.sum()).astype(np.float32)


def blur(row: np.ndarray, kernel_size: tuple[int, int], sigma: tuple[float, float]) -> np.ndarray:
    """torchvision's ``gaussian_blur``: separable kernel, reflected borders, rounded.
    ``kernel_size`` and ``sigma`` are (x, y)."""
    import cv2

    kx = gaussian_kernel(kernel_size[0], sigma[0])
    ky = gaussian_kernel(kernel_size[1], sigma[1])
    result = cv2.sepFilter2D(row, -1, kx, ky, dst=row, borderType=cv2.BORDER_REFLECT_101)
    if result is not row:
        np.copyto(row, result)
    return row


@functools.lru_cache(maxsize=1024)
def box_blur_weights(radius: float) -> np.ndarray:
    """The 1-d kernel of one of the three box passes of PIL's ``GaussianBlur(radius)``: box
    radius l + a from the Gaussian's variance split over 3 passes (PIL's float32 arithmetic),
    weight ``ww`` = 2^24 / (2 (l + a) + 1) on the 2 l + 1 inner pixels and ``fw`` (the rest of
    2^24, halved) on the two outer ones; as float64 fractions of 2^24, which are exact."""
    f32 = np.float32
    sigma2 = f32(radius) * f32(radius) / f32(3)
    length = f32(math.sqrt(12.0 * float(sigma2) + 1.0))
    whole = f32(math.floor((float(length) - 1.0) / 2.0))
    frac = (f32(2) * whole + f32(1)) * (whole * (whole + f32(1)) - f32(3) * sigma2)
    frac /= f32(6) * (sigma2 - (whole + f32(1)) * (whole + f32(1)))
    box = f32(whole + frac)
    inner = int(box)
    ww = int(f32(1 << 24) / (box * f32(2) + f32(1)))
    fw = ((1 << 24) - (2 * inner + 1) * ww) // 2
    kernel = np.full(2 * inner + 3, ww, np.float64)
    kernel[0] = kernel[-1] = fw
    kernel /= 1 << 24
    kernel.flags.writeable = False
    return kernel


def pil_gaussian_blur(row: np.ndarray, radius: float) -> np.ndarray:
    """``img.filter(ImageFilter.GaussianBlur(radius))`` (timm's ``gaussian_blur``), exactly:
    three box passes along x then three along y, each rounded to uint8 as PIL rounds it
    ((sum + 2^23) >> 24), edge pixels repeated. Each pass is ``cv2.filter2D`` into float64,
    where the 24-bit weights times the levels sum exactly, then + 0.5 and truncated. Why not
    float32 (4x faster): its sums put 5-30% of the levels one off. ``radius`` <= 0: the row."""
    import cv2

    if not radius > 0:
        return row
    kernel = box_blur_weights(float(radius))
    out = row if row.flags.writeable else row.copy()
    acc = np.empty(row.shape, np.float64)
    for k in (kernel.reshape(1, -1),) * 3 + (kernel.reshape(-1, 1),) * 3:
        cv2.filter2D(out, cv2.CV_64F, k, dst=acc, borderType=cv2.BORDER_REPLICATE)
        acc += 0.5
        np.copyto(out, acc, casting="unsafe")
    return out


def invert(row: np.ndarray) -> np.ndarray:
    """``ImageOps.invert``: 255 - x."""
    import cv2

    result = cv2.bitwise_not(row, dst=row)
    if result is not row:
        np.copyto(row, result)
    return row


@functools.lru_cache(maxsize=512)
def _solarize_table(threshold: float) -> np.ndarray:
    levels = np.arange(256)
    return np.where(levels < threshold, levels, 255 - levels).astype(np.uint8)


def solarize(row: np.ndarray, threshold: float) -> np.ndarray:
    """``ImageOps.solarize``: x below ``threshold`` kept, 255 - x from it up."""
    return lut(row, _solarize_table(float(threshold)))


@functools.lru_cache(maxsize=512)
def _solarize_add_table(add: int, threshold: int) -> np.ndarray:
    levels = np.arange(256)
    return np.where(levels < threshold, np.minimum(255, levels + add), levels).astype(np.uint8)


def solarize_add(row: np.ndarray, add: int, threshold: int = 128) -> np.ndarray:
    """timm's ``solarize_add``: min(255, x + add) below ``threshold``, x from it up."""
    return lut(row, _solarize_add_table(int(add), int(threshold)))


@functools.lru_cache(maxsize=16)
def _posterize_table(bits: int) -> np.ndarray:
    mask = ~(2 ** (8 - bits) - 1) & 0xFF
    return (np.arange(256) & mask).astype(np.uint8)


def posterize(row: np.ndarray, bits: int) -> np.ndarray:
    """``ImageOps.posterize``: keep the ``bits`` high bits (0-8)."""
    if bits >= 8:
        return row
    return lut(row, _posterize_table(int(bits)))


def _histograms(row: np.ndarray) -> list[np.ndarray]:
    import cv2

    return [cv2.calcHist([row], [c], None, [256], [0, 256]).ravel().astype(np.int64)
            for c in range(3)]


def equalize(row: np.ndarray) -> np.ndarray:
    """``ImageOps.equalize``: per channel, step = (pixels - count of the top level present) // 255,
    table[i] = (step // 2 + pixels below i) // step; unchanged where step is 0."""
    tables = np.empty((256, 3), np.uint8)
    for c, h in enumerate(_histograms(row)):
        present = h[h > 0]
        step = (int(present.sum()) - int(present[-1])) // 255 if len(present) > 1 else 0
        if step == 0:
            tables[:, c] = np.arange(256)
            continue
        below = np.concatenate(([0], np.cumsum(h)[:-1]))
        tables[:, c] = np.clip((step // 2 + below) // step, 0, 255)
    return lut(row, tables)


def autocontrast(row: np.ndarray) -> np.ndarray:
    """``ImageOps.autocontrast`` (cutoff 0): per channel, [lo, hi] stretched to [0, 255] as
    ``int(x * 255 / (hi - lo) - lo * 255 / (hi - lo))``; unchanged where hi <= lo."""
    tables = np.empty((256, 3), np.uint8)
    levels = np.arange(256, dtype=np.float64)
    for c, h in enumerate(_histograms(row)):
        nz = np.flatnonzero(h)
        lo, hi = int(nz[0]), int(nz[-1])
        if hi <= lo:
            tables[:, c] = np.arange(256)
            continue
        scale = 255.0 / (hi - lo)
        tables[:, c] = np.clip((levels * scale - lo * scale).astype(np.int64), 0, 255)
    return lut(row, tables)


def angle_ok(value: float) -> bool:
    """True for a finite number (angles, shears)."""
    return isinstance(value, (int, float)) and math.isfinite(value)
