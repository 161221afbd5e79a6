"""Synthetic, photo-like test images and image folders.

The images mix smooth low-frequency colour fields, soft blobs, hard edges and sensor-like noise,
so their JPEG sizes and decode times resemble photographs (a 400x350 image at quality 90 is
roughly 20-40 KB), unlike flat colours or white noise. Used by the tests, benchmarks and demo.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.errors import shorten

logger = logging.getLogger(__name__)

# Phone-camera sizes for make_image_folder(large=True): 3000x2250 to 4000x3000 (height, width
# ranges drawn independently, so aspect ratios from 0.56 to 1.33).
LARGE_SIZE = ((2250, 3000), (3000, 4000))

_FORMATS = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "bmp": ".bmp"}


def photo_like(
    height: int, width: int, *, seed: int | np.random.Generator = 0, noise: float = 6.0
) -> np.ndarray:
    """Return a photo-like (height, width, 3) uint8 RGB image.

    ``seed`` (int or Generator) fixes the content; ``noise`` is the noise standard deviation in
    8-bit levels.
    """
    import cv2

    if height <= 0 or width <= 0:
        raise ValueError(f"`height` and `width` must be > 0. Found: {height}x{width}.")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    # Low-frequency colour field: a tiny random image upscaled smoothly.
    base = rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
    img = cv2.resize(base, (width, height), interpolation=cv2.INTER_CUBIC)
    # Soft blobs and hard-edged shapes (objects).
    scale = max(height, width)
    for _ in range(int(rng.integers(4, 9))):
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(scale // 20 + 1, scale // 4 + 2)),
                int(rng.integers(scale // 20 + 1, scale // 4 + 2)))
        cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, color, -1, cv2.LINE_AA)
    img = cv2.GaussianBlur(img, (0, 0), sigmaX=max(1.0, scale / 200))
    for _ in range(int(rng.integers(3, 7))):
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        p1 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        p2 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        if rng.random() < 0.5:
            cv2.line(img, p1, p2, color, int(rng.integers(1, 4)), cv2.LINE_AA)
        else:
            cv2.rectangle(img, p1, p2, color, 1 + int(rng.integers(0, 2)), cv2.LINE_AA)
    if noise > 0:
        # Noise from a reused tile at a random offset: much faster than fresh noise per pixel.
        tile = _noise_tile(float(noise))
        th, tw = tile.shape[:2]
        y0, x0 = int(rng.integers(0, th)), int(rng.integers(0, tw))
        reps = (-(-(y0 + height) // th), -(-(x0 + width) // tw), 1)
        field = np.tile(tile, reps) if reps != (1, 1, 1) else tile
        img = np.clip(img.astype(np.int16) + field[y0:y0 + height, x0:x0 + width], 0, 255)
        img = img.astype(np.uint8)
    return np.ascontiguousarray(img)


def large_photo(
    height: int, width: int, *, seed: int | np.random.Generator = 0, noise: float = 6.0
) -> np.ndarray:
    """A photo-like (height, width, 3) uint8 RGB image for phone/camera sizes (e.g. 4000x3000).

    :func:`photo_like` at a quarter of the size, upscaled (INTER_CUBIC), then hard edges and
    sensor-like noise at full size: about 1 s for 12 MP where :func:`photo_like` blurs at full
    size for ~10 s. At 4000x3000, quality 95 (4:2:0) JPEGs are 2.5-4.5 MB (noise 3-6), as phone
    photos; quality 90: 1.4-2.5 MB.
    """
    import cv2

    if height <= 0 or width <= 0:
        raise ValueError(f"`height` and `width` must be > 0. Found: {height}x{width}.")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    small = photo_like(max(1, height // 4), max(1, width // 4), seed=rng, noise=0.0)
    img = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    for _ in range(int(rng.integers(6, 12))):  # full-resolution detail: thin lines and frames
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        p1 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        p2 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        if rng.random() < 0.5:
            cv2.line(img, p1, p2, color, int(rng.integers(1, 6)), cv2.LINE_AA)
        else:
            cv2.rectangle(img, p1, p2, color, 1 + int(rng.integers(0, 4)), cv2.LINE_AA)
    if noise > 0:
        tile = _noise_tile(float(noise))
        th, tw = tile.shape[:2]
        y0, x0 = int(rng.integers(0, th)), int(rng.integers(0, tw))
        reps = (-(-(y0 + height) // th), -(-(x0 + width) // tw), 1)
        field = np.tile(tile, reps)[y0:y0 + height, x0:x0 + width]
        img = np.clip(img.astype(np.int16) + field, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(img)


_NOISE_TILES: dict[float, np.ndarray] = {}


def _noise_tile(sigma: float) -> np.ndarray:
    tile = _NOISE_TILES.get(sigma)
    if tile is None:
        rng = np.random.default_rng(12345)
        tile = np.round(rng.normal(0.0, sigma, size=(256, 256, 3))).astype(np.int16)
        _NOISE_TILES[sigma] = tile
    return tile


def encode(img_rgb: np.ndarray, fmt: str = "jpeg", *, quality: int = 90,
           progressive: bool = False, subsampling: str = "420") -> bytes:
    """Encode an RGB (or grayscale 2-D) uint8 image to ``fmt`` bytes with OpenCV.

    ``subsampling`` is "420", "422" or "444" (JPEG only); ``quality`` is 1-100 (JPEG/WebP).
    """
    import cv2

    if fmt not in _FORMATS:
        raise ValueError(f"`fmt` must be one of {sorted(_FORMATS)}. Found: {shorten(fmt)}.")
    arr = img_rgb if img_rgb.ndim == 2 else cv2.cvtColor(img_rgb, cv2.COLOR_RGB2BGR)
    params: list[int] = []
    if fmt == "jpeg":
        factors = {"420": 0x221111, "422": 0x211111, "444": 0x111111}
        if subsampling not in factors:
            raise ValueError(f"`subsampling` must be one of {sorted(factors)}. "
                             f"Found: {shorten(subsampling)}.")
        params = [cv2.IMWRITE_JPEG_QUALITY, int(quality),
                  cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
        if arr.ndim == 3:
            params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factors[subsampling]]
    elif fmt == "webp":
        params = [cv2.IMWRITE_WEBP_QUALITY, int(quality)]
    ok, buf = cv2.imencode(_FORMATS[fmt], arr, params)
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a {arr.shape} image as {fmt}.")
    return buf.tobytes()


@dataclass(frozen=True)
class SynthFolder:
    """What :func:`make_image_folder` wrote: the root, class names and the number of files."""

    root: Path
    classes: tuple[str, ...]
    num_images: int


def make_image_folder(
    root: str | os.PathLike,
    *,
    num_classes: int = 4,
    per_class: int = 32,
    size: tuple[int, int] | tuple[tuple[int, int], tuple[int, int]] = (350, 400),
    seed: int = 0,
    fmt: str = "jpeg",
    quality: int = 90,
    large: bool = False,
) -> SynthFolder:
    """Write a torchvision-style image folder ``root/class_XX/img_XXXXX.<ext>``.

    ``size`` is (height, width) in pixels, or ((min_h, max_h), (min_w, max_w)) for sizes drawn
    uniformly per image (inclusive). ``large``: draw the images with :func:`large_photo` (fast
    at phone sizes; e.g. ``size=LARGE_SIZE, quality=95`` for 2.5-4.5 MB JPEGs). Returns the
    root, class names and image count.
    """
    if num_classes <= 0:
        raise ValueError(f"`num_classes` must be > 0. Found: {num_classes}.")
    if per_class <= 0:
        raise ValueError(f"`per_class` must be > 0. Found: {per_class}.")
    if fmt not in _FORMATS:
        raise ValueError(f"`fmt` must be one of {sorted(_FORMATS)}. Found: {shorten(fmt)}.")
    h_range, w_range = _size_ranges(size)
    rng = np.random.default_rng(seed)
    root = Path(root)
    classes = tuple(f"class_{c:02d}" for c in range(num_classes))
    for name in classes:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h = int(rng.integers(h_range[0], h_range[1] + 1))
            w = int(rng.integers(w_range[0], w_range[1] + 1))
            img = (large_photo if large else photo_like)(h, w, seed=rng)
            (folder / f"img_{i:05d}{_FORMATS[fmt]}").write_bytes(encode(img, fmt, quality=quality))
    logger.debug("wrote %d synthetic images to %s", num_classes * per_class, root)
    return SynthFolder(root=root, classes=classes, num_images=num_classes * per_class)


def _size_ranges(size: Sequence[Any]) -> tuple[tuple[int, int], tuple[int, int]]:
    if len(size) != 2:
        raise ValueError(f"`size` must be (height, width) or ((min_h, max_h), (min_w, max_w)). "
                         f"Found: {shorten(size)}.")
    h, w = size
    # np.ndim, not np.isscalar: the latter is a type guard that narrows ``h`` to numpy's scalar
    # union (complex, str, ...), which int() does not take; the two agree on every valid size.
    hr = (int(h), int(h)) if np.ndim(h) == 0 else (int(h[0]), int(h[1]))
    wr = (int(w), int(w)) if np.ndim(w) == 0 else (int(w[0]), int(w[1]))
    if min(hr + wr) <= 0 or hr[0] > hr[1] or wr[0] > wr[1]:
        raise ValueError(f"`size` must hold positive sizes with min <= max. Found: {shorten(size)}.")
    return hr, wr


def with_exif_orientation(jpeg: bytes, orientation: int, *, big_endian: bool = False) -> bytes:
    """Return ``jpeg`` with an APP1/Exif segment holding the Orientation tag (1-8) after SOI."""
    import struct

    if jpeg[:2] != b"\xff\xd8":
        raise ValueError("`jpeg` must start with the JPEG SOI marker (FF D8).")
    if not 1 <= orientation <= 8:
        raise ValueError(f"`orientation` must be in 1..8. Found: {orientation}.")
    e = ">" if big_endian else "<"
    tiff = (b"MM" if big_endian else b"II") + struct.pack(e + "HI", 42, 8)
    tiff += struct.pack(e + "H", 1) + struct.pack(e + "HHIHH", 0x0112, 3, 1, orientation, 0)
    tiff += struct.pack(e + "I", 0)
    payload = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]
