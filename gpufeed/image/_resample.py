"""The pixel work of the transforms: crop a region, resize it to the output size, flip it, and
write it into ``out`` ((H, W, 3) or (3, H, W) uint8, a row of the batch).

Two paths, chosen by :meth:`gpufeed.image.ImageTransform.apply`:

- :func:`crop_resize` takes a decoded (H, W, 3) RGB image: crop, one resize, flip.
- :func:`crop_resize_planes` takes the Y, Cb, Cr planes of a JPEG (or its Y plane alone for
  greyscale): it resizes each plane straight to the output size, which also upsamples the
  sub-sampled chroma, then converts YCbCr to RGB once, at the output size, and flips.

Box coordinates are in pixels of the full-size source image; the image or planes may be
DCT-scaled, and the box is scaled to them. Buffers reused between calls are per thread.
"""

from __future__ import annotations

import math
import threading

import numpy as np

Box = tuple[float, float, float, float]  # top, left, height, width in full-size source pixels

# Chroma alignment: how many leading output pixels the chroma resize may compute and drop
# (see _chroma_span). 3 leaves a mean offset of 0.04 chroma pixels (0 allows 0.25).
_MAX_SKIP = 3

_scratch = threading.local()


def resize_mode(rh: int, rw: int, oh: int, ow: int, interpolation: str) -> int:
    """The OpenCV interpolation for a (rh, rw) region resized to (oh, ow) pixels under
    ``interpolation`` ("auto", "area", "linear" or "bicubic"; see gpufeed.image)."""
    import cv2

    shrink = rh >= oh and rw >= ow
    if shrink and (interpolation == "area" or (
            interpolation in ("auto", "bicubic") and (rh >= 2 * oh or rw >= 2 * ow))):
        return cv2.INTER_AREA
    return cv2.INTER_CUBIC if interpolation == "bicubic" else cv2.INTER_LINEAR


def crop_resize(img: np.ndarray, full_h: int, full_w: int, box: Box, flip: bool,
                out: np.ndarray, layout: str, interpolation: str) -> None:
    """Crop ``box`` out of ``img`` (an (h, w, 3) RGB image, possibly DCT-scaled from
    full_h x full_w), resize it to ``out``'s size, flip it horizontally if asked, and write it
    into ``out`` (``layout`` "hwc" or "chw")."""
    import cv2

    y0, y1, x0, x1 = crop_region(img.shape[0], img.shape[1], full_h, full_w, box)
    oh, ow = _out_size(out, layout)
    target = out if layout == "hwc" else _scratch_hwc(oh, ow)
    _resize_into(img[y0:y1, x0:x1], target, interpolation)
    if flip:
        cv2.flip(target, 1, dst=target)
    if layout == "chw":
        _split_into(target, out)


def crop_resize_planes(planes: list[np.ndarray], sub: tuple[int, int], full_h: int,
                       full_w: int, box: Box, flip: bool, out: np.ndarray, layout: str,
                       interpolation: str) -> None:
    """As :func:`crop_resize`, from JPEG planes: ``planes`` is [Y] (greyscale) or [Y, Cb, Cr]
    (full-range BT.601, as :func:`gpufeed.decoders.decode_planes` returns them), Y being (h, w)
    (possibly DCT-scaled from full_h x full_w) and the chroma planes sub-sampled by ``sub`` =
    (sub_y, sub_x), 1 or 2 each, with each chroma sample centred on its sub_y x sub_x luma block.

    The luma region is the one :func:`crop_resize` takes. Each chroma plane is resampled so that
    its samples land on the same source positions as the luma samples (to within
    :func:`_chroma_span`'s offset), then the planes are merged in (Y, Cr, Cb) order, which is
    OpenCV's COLOR_YCrCb2RGB (JPEG's conversion).
    """
    import cv2

    luma_plane = planes[0]
    y0, y1, x0, x1 = crop_region(luma_plane.shape[0], luma_plane.shape[1], full_h, full_w, box)
    oh, ow = _out_size(out, layout)
    luma = out[0] if layout == "chw" else _scratch_plane(oh, ow)
    _resize_into(luma_plane[y0:y1, x0:x1], luma, interpolation)
    if len(planes) == 1:  # greyscale: Y is the value of all three channels
        if flip:
            cv2.flip(luma, 1, dst=luma)
        if layout == "chw":
            np.copyto(out[1], luma)
            np.copyto(out[2], luma)
        else:
            _merge_into((luma, luma, luma), out)
        return
    sub_y, sub_x = sub
    cy0, cy1, skip_y, inv_y = _chroma_span(y0, y1, sub_y, oh, planes[1].shape[0])
    cx0, cx1, skip_x, inv_x = _chroma_span(x0, x1, sub_x, ow, planes[1].shape[1])
    mode = resize_mode(-(-(y1 - y0) // sub_y), -(-(x1 - x0) // sub_x), oh, ow, interpolation)
    cb = cv2.resize(planes[1][cy0:cy1, cx0:cx1], None, fx=inv_x, fy=inv_y, interpolation=mode)
    cr = cv2.resize(planes[2][cy0:cy1, cx0:cx1], None, fx=inv_x, fy=inv_y, interpolation=mode)
    cb, cr = cb[skip_y:skip_y + oh, skip_x:skip_x + ow], cr[skip_y:skip_y + oh, skip_x:skip_x + ow]
    target = out if layout == "hwc" else _scratch_hwc(oh, ow)
    _merge_into((luma, cr, cb), target)
    result = cv2.cvtColor(target, cv2.COLOR_YCrCb2RGB, dst=target)
    if result is not target:  # OpenCV allocated instead of converting in place
        np.copyto(target, result)
    if flip:
        cv2.flip(target, 1, dst=target)
    if layout == "chw":
        _split_into(target, out)


def crop_region(dh: int, dw: int, full_h: int, full_w: int, box: Box) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): ``box`` (full-size source pixels) rounded to whole pixels of a
    dh x dw image, at least one pixel, inside it."""
    sy, sx = dh / full_h, dw / full_w
    top, left, bh, bw = box
    y0 = min(max(int(round(top * sy)), 0), dh - 1)
    x0 = min(max(int(round(left * sx)), 0), dw - 1)
    y1 = min(max(int(round((top + bh) * sy)), y0 + 1), dh)
    x1 = min(max(int(round((left + bw) * sx)), x0 + 1), dw)
    return y0, y1, x0, x1


def _chroma_span(start: int, stop: int, sub: int, n: int,
                 length: int) -> tuple[int, int, int, float]:
    """How to resample one axis of a chroma plane (``length`` samples, ``sub`` luma pixels per
    sample) so that it lines up with the luma region [start, stop) resized to ``n`` pixels.

    Returns (c0, c1, skip, inv_step): resize chroma[c0:c1] by the factor ``inv_step`` (not to a
    target size) and drop the first ``skip`` output pixels; the next ``n`` are the result.

    Why: output pixel j of the luma resize is centred at luma position
    start + (j + 0.5) * step * sub (pixel edges at integers), so the chroma value to use there
    is at chroma position origin + (j + 0.5) * step with origin = start / sub and
    step = (stop - start) / (sub * n). cv2.resize of a region starting at an integer c0 samples
    c0 + (j + 0.5) * step: exact only when sub divides start (and stop, for the step to come
    out of a whole-pixel region). Giving cv2.resize the exact step as a factor fixes the step;
    dropping ``skip`` pixels moves the start to c0 + skip * step, and we pick the c0 and skip
    (0 to _MAX_SKIP) that land nearest to origin. Rounding the region to whole chroma pixels
    instead misregisters colour by up to half a chroma pixel, which doubled the difference from
    the RGB path on 4:2:0 photo-like images (mean 1.4-1.6 vs 0.7 levels, 99th percentile 17-20
    vs 7-8) and made the result further from the unencoded image than the RGB path's.
    """
    inv_step = sub * n / (stop - start)
    if sub == 1:
        return start, stop, 0, inv_step
    step = 1.0 / inv_step
    if start % sub == 0:  # origin is a whole chroma pixel: exact without skipping
        c0 = start // sub
        return c0, min(length, c0 + math.ceil(n * step) + 1), 0, inv_step
    origin = start / sub
    best = (math.floor(origin), 0)  # always covers n pixels (the plane reaches stop / sub)
    best_error = origin - best[0]
    for skip in range(1, _MAX_SKIP + 1):
        base = origin - skip * step
        if base < -0.5:
            break
        c0 = max(0, math.floor(base + 0.5))
        error = abs(c0 - base)
        # Only if cv2.resize's output, round((c1 - c0) * inv_step), reaches n + skip pixels.
        if error < best_error and round((length - c0) * inv_step) >= n + skip:
            best, best_error = (c0, skip), error
    c0, skip = best
    return c0, min(length, c0 + math.ceil((n + skip) * step) + 1), skip, inv_step


def _out_size(out: np.ndarray, layout: str) -> tuple[int, int]:
    return (out.shape[0], out.shape[1]) if layout == "hwc" else (out.shape[1], out.shape[2])


def _resize_into(region: np.ndarray, target: np.ndarray, interpolation: str) -> None:
    """Resize ``region`` to ``target``'s size (copy if equal) and write it into ``target``."""
    import cv2

    oh, ow = target.shape[:2]
    rh, rw = region.shape[:2]
    if (rh, rw) == (oh, ow):
        np.copyto(target, region)
        return
    result = cv2.resize(region, (ow, oh), dst=target,
                        interpolation=resize_mode(rh, rw, oh, ow, interpolation))
    if result is not target:  # OpenCV allocated instead of writing in place
        np.copyto(target, result)


def _merge_into(planes: tuple[np.ndarray, np.ndarray, np.ndarray], target: np.ndarray) -> None:
    import cv2

    result = cv2.merge(planes, target)
    if result is not target:
        np.copyto(target, result)


def split_into(hwc: np.ndarray, out: np.ndarray) -> None:
    """Write an (H, W, 3) image into the (3, H, W) ``out``."""
    _split_into(hwc, out)


def scratch_rows(oh: int, ow: int) -> np.ndarray:
    """A per-thread reusable (oh, ow, 3) row for a transform's augmentations (another buffer
    than the one :func:`crop_resize` uses for the planar layout)."""
    buf = getattr(_scratch, "aug", None)
    if buf is None or buf.shape != (oh, ow, 3):
        buf = np.empty((oh, ow, 3), np.uint8)
        _scratch.aug = buf
    return buf


def _split_into(hwc: np.ndarray, out: np.ndarray) -> None:
    """Write an (H, W, 3) image into the (3, H, W) ``out``."""
    import cv2

    views = [out[0], out[1], out[2]]
    if cv2.split(hwc, views)[0] is not views[0]:  # OpenCV allocated instead of writing in place
        np.copyto(out, hwc.transpose(2, 0, 1))


def _scratch_hwc(oh: int, ow: int) -> np.ndarray:
    """A per-thread reusable (oh, ow, 3) buffer, for the planar (CHW) output path."""
    buf = getattr(_scratch, "hwc", None)
    if buf is None or buf.shape != (oh, ow, 3):
        buf = np.empty((oh, ow, 3), np.uint8)
        _scratch.hwc = buf
    return buf


def _scratch_plane(oh: int, ow: int) -> np.ndarray:
    """A per-thread reusable (oh, ow) buffer, for the luma plane of an HWC output."""
    buf = getattr(_scratch, "plane", None)
    if buf is None or buf.shape != (oh, ow):
        buf = np.empty((oh, ow), np.uint8)
        _scratch.plane = buf
    return buf
