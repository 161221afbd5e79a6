"""decode(): encoded bytes to an (H, W, 3) uint8 RGB array, optionally at a reduced DCT scale.

Both backends follow one contract: RGB, C-contiguous, grey expanded to three channels, alpha
dropped, EXIF orientation of JPEGs applied (by us, from :func:`read_header`, so that both
backends agree: OpenCV is told to ignore it), and every failure raised as
:class:`~gpufeed.errors.DecodeError`. libjpeg-turbo fills a truncated JPEG with grey and only
warns; such warnings are errors here, except "extraneous bytes before marker", which leaves the
pixels intact (PIL and OpenCV accept such files too).

decode_planes(): the Y, Cb and Cr planes of a YCbCr (or the Y plane of a greyscale) JPEG as
libjpeg-turbo decodes them, before chroma upsampling and colour conversion, under the same error
rules; the transforms resize the planes and convert colour at the (smaller) output size.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from gpufeed.decoders import _backends
from gpufeed.decoders._backends import FACTORS
from gpufeed.decoders._header import Buffer, ImageHeader, as_buffer, read_header
from gpufeed.errors import DecodeError

_BENIGN_WARNINGS = ("extraneous bytes before marker",)
_WARNINGS_LOCK = threading.Lock()  # see _turbo_call
# A child forked while another thread held it gets a free one (that thread is not in the child).
os.register_at_fork(after_in_child=lambda: globals().update(_WARNINGS_LOCK=threading.Lock()))


def scaled_size(height: int, width: int, factor: tuple[int, int]) -> tuple[int, int]:
    """Output (height, width) in pixels of a DCT-scaled decode by ``factor`` = (num, denom):
    ``ceil(d * num / denom)`` per axis, as libjpeg computes it."""
    num, den = factor
    return -(-height * num // den), -(-width * num // den)


def choose_factor(header: ImageHeader, min_height: int | None, min_width: int | None,
                  backend: str | None = None) -> tuple[int, int]:
    """The smallest DCT scaling factor whose output is >= (min_height, min_width) on both axes.

    Factors are taken from ``FACTORS`` (those libjpeg-turbo reports in
    ``TurboJPEG.scaling_factors``). Sizes are in pixels of the oriented image (as :func:`decode`
    returns it). Returns (1, 1) for non-JPEG input or when no minimum is given.
    """
    if header.fmt != "jpeg" or (min_height is None and min_width is None):
        return (1, 1)
    if jpeg_decoder(header, backend) == "turbojpeg":
        supported = set(_backends.turbo_state().scaling_factors)
        factors = tuple(f for f in FACTORS if f in supported) or ((1, 1),)
    else:
        factors = FACTORS
    need_h = 1 if min_height is None else int(min_height)
    need_w = 1 if min_width is None else int(min_width)
    for factor in factors:  # ascending
        h, w = scaled_size(header.height, header.width, factor)
        if h >= need_h and w >= need_w:
            return factor
    return (1, 1)


def jpeg_decoder(header: ImageHeader, backend: str | None) -> str:
    """Which backend decodes this image: "turbojpeg" or "opencv"."""
    if header.fmt != "jpeg" or header.cmyk:
        _backends.jpeg_backend(backend)  # still validate the request and warn on fallback
        return "opencv"
    return _backends.jpeg_backend(backend)


def decode(data: Buffer, *, min_height: int | None = None, min_width: int | None = None,
           backend: str | None = None, header: ImageHeader | None = None) -> np.ndarray:
    """Decode an encoded image into an (H, W, 3) uint8 RGB C-contiguous array.

    ``min_height``/``min_width`` (pixels of the oriented output): JPEGs are decoded at the
    smallest DCT scaling factor of 1/8, 1/4, 1/2, 1 (see ``FACTORS``) whose output is still at
    least that large on both axes; other formats at full size.
    ``backend``: None (libjpeg-turbo when it loads, else OpenCV), "turbojpeg" or "opencv"; it
    selects the JPEG decoder: PNG, WebP, BMP, TIFF and CMYK JPEGs always go to OpenCV.
    Alpha is dropped; 16-bit and float greyscale values are clipped to 0-255 (16-bit colour
    keeps each value's high byte), as PIL's ``convert("RGB")``, which torchvision's loaders use.
    ``header``: the result of :func:`read_header` for ``data``, if the caller already has it.
    Raises :class:`~gpufeed.errors.DecodeError` on empty, truncated, corrupt or non-image input.
    """
    buf = as_buffer(data)
    if header is None:
        header = read_header(buf)
    factor = choose_factor(header, min_height, min_width, backend)
    if jpeg_decoder(header, backend) == "turbojpeg":
        img = _decode_turbojpeg(buf, header, factor)
    else:
        img = _decode_opencv(buf, header, factor)
    img = apply_orientation(img, header.orientation)
    expected = scaled_size(header.height, header.width, factor)
    if img.shape[:2] != expected:
        raise DecodeError(f"{header.fmt}: decoded size {img.shape[1]}x{img.shape[0]} differs from "
                          f"the header's {expected[1]}x{expected[0]} (at scale "
                          f"{factor[0]}/{factor[1]}): corrupt file")
    return img


def _decode_turbojpeg(buf: memoryview, header: ImageHeader, factor: tuple[int, int]) -> np.ndarray:
    from turbojpeg import TJPF_RGB

    decoder = _backends.turbo_state().decoder
    scaling = None if factor == (1, 1) else factor
    return _turbo_call(lambda arr: decoder.decode(arr, pixel_format=TJPF_RGB,
                                                  scaling_factor=scaling), buf)


def decode_turbojpeg_into(buf: memoryview, out: np.ndarray, factor: tuple[int, int] = (1, 1)) -> None:
    """Decode a JPEG whose frame, scaled by ``factor``, is ``out``'s (H, W) into ``out``
    ((H, W, 3) uint8, C-contiguous) with libjpeg-turbo, as stored (no EXIF orientation), under
    :func:`decode`'s error rules."""
    from turbojpeg import TJPF_RGB

    decoder = _backends.turbo_state().decoder
    scaling = None if factor == (1, 1) else factor
    got = _turbo_call(lambda arr: decoder.decode(arr, pixel_format=TJPF_RGB, scaling_factor=scaling,
                                                 dst=out), buf)
    if got is not out:  # PyTurboJPEG allocates when the frame's size is not out's
        raise DecodeError(f"jpeg: decoded size {got.shape[1]}x{got.shape[0]} differs from the "
                          f"header's {out.shape[1]}x{out.shape[0]}: corrupt file")


def _turbo_call(fn: Callable[[np.ndarray], Any], buf: memoryview) -> Any:
    """Run ``fn`` (a PyTurboJPEG decode) on ``buf`` as a uint8 array, raising DecodeError for a
    libjpeg error (OSError) or a warning that is not in ``_BENIGN_WARNINGS``.

    PyTurboJPEG reports a truncated JPEG only by ``warnings.warn``, and ``catch_warnings`` swaps
    process-wide state: two threads inside it at once lose each other's warnings (and leave
    warnings going to a stale list), so decodes on several threads of one process (``pack``'s
    threads) take turns here. A loader worker decodes on one thread: the lock is uncontended.
    """
    arr = np.frombuffer(buf, np.uint8)
    with _WARNINGS_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(arr)
        except OSError as exc:
            raise DecodeError(f"turbojpeg: {exc} ({len(buf)} bytes)") from None
    for warning in caught:
        message = str(warning.message)
        if not any(benign in message for benign in _BENIGN_WARNINGS):
            raise DecodeError(f"turbojpeg: {message} ({len(buf)} bytes): truncated or corrupt JPEG")
    return result


def plane_subsampling(header: ImageHeader) -> tuple[int, int] | None:
    """(vertical, horizontal) chroma subsampling of a YCbCr JPEG whose chroma components are
    both sampled (1, 1) and whose luma is sampled at most 2 per axis ((1, 1) for 4:4:4, (2, 2)
    for 4:2:0, (1, 2) for 4:2:2, (2, 1) for 4:4:0); (1, 1) for a greyscale JPEG; None for
    anything else (other layouts, RGB/CMYK colour spaces, other formats)."""
    if header.fmt != "jpeg":
        return None
    if header.colorspace == "gray" and len(header.sampling) == 1:
        return (1, 1)
    if header.colorspace != "ycbcr" or len(header.sampling) != 3:
        return None
    (luma_h, luma_v), chroma1, chroma2 = header.sampling
    if chroma1 != (1, 1) or chroma2 != (1, 1) or luma_h not in (1, 2) or luma_v not in (1, 2):
        return None
    return (luma_v, luma_h)


def decode_planes(data: Buffer, *, header: ImageHeader | None = None,
                  factor: tuple[int, int] = (1, 1)) -> list[np.ndarray]:
    """Decode a YCbCr or greyscale JPEG into its planes with libjpeg-turbo, skipping the chroma
    upsampling and colour conversion that :func:`decode` does.

    Returns [Y] for a greyscale JPEG, else [Y, Cb, Cr] (uint8, JPEG's full-range BT.601 YCbCr,
    stored orientation: EXIF orientation is *not* applied). Y is (H, W) pixels with (H, W) =
    ``scaled_size(encoded_height, encoded_width, factor)``; Cb and Cr are
    (ceil(H / sub_y), ceil(W / sub_x)) for the ``(sub_y, sub_x)`` of :func:`plane_subsampling`,
    each chroma sample centred on the sub_y x sub_x luma block it covers (JFIF siting).
    ``factor``: a DCT scaling factor from ``FACTORS``. At factors below 1 libjpeg-turbo decodes
    the chroma planes at sub-sampled size too, whereas :func:`decode` IDCT-scales them to the
    luma size, so colour keeps less detail here.
    Raises ValueError when :func:`plane_subsampling` is None or libjpeg-turbo is not loaded,
    and :class:`~gpufeed.errors.DecodeError` for undecodable input or planes whose sizes differ
    from the header's.
    """
    buf = as_buffer(data)
    if header is None:
        header = read_header(buf)
    sub = plane_subsampling(header)
    decoder = _backends.turbo_state().decoder
    if sub is None or decoder is None:
        raise ValueError(f"decode_planes needs a YCbCr or greyscale JPEG and libjpeg-turbo. "
                         f"Found: {header.fmt} {header.colorspace or ''} sampling "
                         f"{header.sampling}, turbojpeg {'loaded' if decoder else 'unavailable'}.")
    scaling = None if factor == (1, 1) else factor
    height, width = scaled_size(header.encoded_height, header.encoded_width, factor)
    if header.colorspace == "gray":
        from turbojpeg import TJPF_GRAY

        # decode_to_yuv_planes fails on greyscale JPEGs in PyTurboJPEG 1.8 (it compares a
        # ctypes c_int to TJSAMP_GRAY and allocates three planes); the grey pixel format is Y.
        img = _turbo_call(lambda arr: decoder.decode(arr, pixel_format=TJPF_GRAY,
                                                     scaling_factor=scaling), buf)
        planes = [img.reshape(img.shape[:2])]
        expected = [(height, width)]
    else:
        planes = _turbo_call(lambda arr: decoder.decode_to_yuv_planes(
            arr, scaling_factor=scaling), buf)
        sub_y, sub_x = sub
        # libjpeg pads the luma plane to whole chroma samples: tjPlaneHeight/tjPlaneWidth.
        padded = (-(-height // sub_y) * sub_y, -(-width // sub_x) * sub_x)
        chroma = (padded[0] // sub_y, padded[1] // sub_x)
        expected = [padded, chroma, chroma]
    found = [p.shape[:2] for p in planes]
    if found != expected:
        raise DecodeError(f"jpeg: decoded planes {found} differ from the header's {expected} "
                          f"(at scale {factor[0]}/{factor[1]}): corrupt file")
    planes[0] = planes[0][:height, :width]
    return planes


def _decode_opencv(buf: memoryview, header: ImageHeader, factor: tuple[int, int]) -> np.ndarray:
    import cv2

    if header.channels == 1 and header.bit_depth > 8:
        return _deep_grey(buf, header)
    flags = cv2.IMREAD_IGNORE_ORIENTATION
    if factor != (1, 1):
        reduced = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                   8: cv2.IMREAD_REDUCED_COLOR_8}[factor[1]]
        flags |= reduced & ~cv2.IMREAD_COLOR
    rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10
    flags |= rgb_flag if rgb_flag is not None else cv2.IMREAD_COLOR
    try:
        img = cv2.imdecode(np.frombuffer(buf, np.uint8), flags)
    except cv2.error as exc:
        raise DecodeError(f"opencv: {str(exc).strip()} ({len(buf)} bytes)") from None
    if img is None:
        raise DecodeError(f"opencv: could not decode {len(buf)} bytes of {header.fmt} "
                          f"(cv2.imdecode returned None): truncated, corrupt or not an image")
    if rgb_flag is None:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return img


def _deep_grey(buf: memoryview, header: ImageHeader) -> np.ndarray:
    """A 16-bit or float greyscale image (PNG, TIFF) as RGB uint8 the way PIL's ``convert("RGB")``
    makes it, which is what torchvision's loaders give: values clipped to 0-255 (a float
    truncated towards zero), not scaled. OpenCV's colour decode would keep the high byte, a
    different picture (16-bit colour PNGs keep their high byte in PIL too, so they need no
    branch)."""
    import cv2

    try:
        img = cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as exc:
        raise DecodeError(f"opencv: {str(exc).strip()} ({len(buf)} bytes)") from None
    if img is None or img.ndim != 2:
        raise DecodeError(f"opencv: could not decode {len(buf)} bytes of {header.fmt} as a "
                          f"{header.bit_depth}-bit greyscale image: truncated or corrupt")
    grey = np.clip(img, 0, 255).astype(np.uint8)  # astype truncates a float towards zero, as PIL
    return np.repeat(grey[:, :, None], 3, axis=2)


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Turn a stored image into its displayed orientation (EXIF tag value 1-8, as PIL's
    ``ImageOps.exif_transpose``). Returns ``img`` itself for orientation 1."""
    if orientation <= 1 or orientation > 8:
        return img
    import cv2

    if orientation == 2:
        return cv2.flip(img, 1)
    if orientation == 3:
        return cv2.rotate(img, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(img, 0)
    if orientation == 5:
        return cv2.transpose(img)
    if orientation == 6:
        return cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.flip(cv2.transpose(img), -1)
    return cv2.rotate(img, cv2.ROTATE_90_COUNTERCLOCKWISE)


def min_size_for_scale(header: ImageHeader, scale: float) -> tuple[int, int]:
    """(min_height, min_width) in pixels to pass to :func:`decode` for an output at least
    ``scale`` times the full size."""
    return (max(1, math.ceil(header.height * scale - 1e-9)),
            max(1, math.ceil(header.width * scale - 1e-9)))
