"""Declarative image transforms that run in workers and write straight into a batch row (the code;
documented in ``gpufeed.image``, which re-exports it)."""

from __future__ import annotations

import copy
import hashlib
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from gpufeed.decoders import (
    choose_factor,
    decode,
    decode_planes,
    decode_rows,
    min_size_for_scale,
    plane_subsampling,
    read_header,
    row_decodable,
    scaled_size,
)
from gpufeed.decoders._backends import BACKENDS
from gpufeed.decoders._decode import jpeg_decoder
from gpufeed.decoders._header import Buffer, ImageHeader
from gpufeed.errors import check_int, is_int, shorten
from gpufeed.image._resample import crop_region, crop_resize, crop_resize_planes, scratch_rows, split_into
from gpufeed.image.augment._base import (
    INTERP_STREAM,
    FloatRowOp,
    RowOp,
    RowOps,
    _check_ops,
    apply_ops,
    row_rng,
)

Size = int | tuple[int, int]
_INTERPOLATIONS = ("auto", "area", "linear", "bicubic", "random")


@dataclass(frozen=True)
class CropParams:
    """A crop box in source pixels (of the oriented, full-size image) and a horizontal flip."""

    top: int
    left: int
    height: int
    width: int
    flip: bool = False


class ImageTransform:
    """Base of gpufeed's transforms: a crop box from the header, then decode/crop/resize/flip.

    Subclasses implement :meth:`_box` and set ``size`` (output (height, width) in pixels).
    """

    # Typed as the constructor takes it; ``__post_init__`` stores it as a (height, width) pair,
    # which :attr:`output_size` gives with that type.
    size: Size
    interpolation: str
    dct_scaling: bool
    backend: str | None
    deterministic: bool = True
    seed: int | None = None
    #: Apply the EXIF orientation (True: gpufeed's transforms) or use the image as stored
    #: (False: translated torchvision pipelines, as torchvision's PIL loader does).
    apply_exif: bool = True
    #: Augmentations after the geometry (gpufeed.image.augment): on the uint8 rows, then on the
    #: normalized float rows of a batch.
    ops: tuple[RowOp, ...] = ()
    float_ops: tuple[FloatRowOp, ...] = ()
    #: Which view of a ``MultiView`` this is: 0 for a transform on its own (and view 0); view
    #: v >= 1 draws its crop, interpolation and ops under keys of its own (:meth:`with_view`).
    view: int = 0

    @property
    def views(self) -> tuple[ImageTransform, ...]:
        """The transforms of a sample's outputs, one per view: this one alone (a
        ``gpufeed.MultiView`` has several)."""
        return (self,)

    def with_view(self, view: int) -> ImageTransform:
        """A copy of this transform serving view ``view`` of a ``MultiView`` (its random
        parameters keyed by (seed, epoch, index, view); view 0 keeps this transform's)."""
        check_int("view", view, 0)
        twin = copy.copy(self)
        object.__setattr__(twin, "view", int(view))
        return twin

    @property
    def row_ops(self) -> RowOps:
        """``ops`` and ``float_ops`` as one :class:`~gpufeed.image.augment._base.RowOps`."""
        return RowOps(self.ops, self.float_ops)

    def sample_interpolation(self, seed: int, epoch: int, index: int) -> str:
        """The resampling of sample ``index``: ``interpolation``, or for "random" "auto"
        (bilinear) or "bicubic", drawn from (seed, epoch, index)."""
        if self.interpolation != "random":
            return self.interpolation
        rng = row_rng(seed, epoch, index, INTERP_STREAM, self.view)
        return ("auto", "bicubic")[int(rng.integers(2))]

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the output in pixels."""
        return cast("tuple[int, int]", self.size)

    def _box(self, height: int, width: int, seed: int, epoch: int,
             index: int) -> tuple[float, float, float, float, bool]:
        """(top, left, height, width, flip): the source box, in (fractional) source pixels."""
        raise NotImplementedError

    def to_output(self, image: Any, *, index: int = 0, epoch: int = 0, seed: int = 0) -> Any:
        """What ``dataset[i]`` returns for ``image``, this transform's uint8 CHW tensor: the
        tensor itself (a translated torchvision pipeline converts dtype and normalizes)."""
        return image

    def batch_options(self, normalize: Any, dtype: Any) -> tuple[Any, Any]:
        """The loader's (normalize, dtype) for batches of this transform: as given (a translated
        torchvision pipeline adds its own ``Normalize`` and dtype)."""
        return normalize, dtype

    def apply(self, data: Buffer, *, index: int = 0, epoch: int = 0, seed: int = 0,
              out: np.ndarray) -> float:
        """Decode ``data`` (encoded image bytes) and write the transformed RGB image into ``out``.

        ``out`` is a C-contiguous uint8 array, (H, W, 3) or (3, H, W) with (H, W) = output_size.
        Returns the seconds spent decoding (the rest of the call is crop/resize/flip).
        Raises :class:`~gpufeed.errors.DecodeError` for undecodable input.
        """
        return self._apply(data, index, epoch, seed, out)

    def _apply(self, data: Buffer, index: int, epoch: int, seed: int, out: np.ndarray, *,
               path: str = "auto") -> float:
        """:meth:`apply`. ``path``: "auto" (the plane path where it pays: :func:`_plane_path`),
        or, for tests and benchmarks, "rgb" (never the plane path) or "planes" (the plane path
        for any YCbCr or greyscale JPEG in stored orientation, ValueError for anything else)."""
        return decode_views((self,), data, index, epoch, seed, (out,), path=path)

    def _into(self, decoded: Any, sub: tuple[int, int] | None, header: ImageHeader,
              box: tuple[float, float, float, float, bool], out: np.ndarray, layout: str,
              seed: int, epoch: int, index: int) -> None:
        """Crop, resize and flip ``decoded`` (an RGB image, or planes when ``sub``) to ``box`` in
        ``out`` (``layout``), then the ops (on an (H, W, 3) row: ``out``, or a scratch row)."""
        top, left, bh, bw, flip = box
        interpolation = self.sample_interpolation(seed, epoch, index)
        target, target_layout = out, layout
        if self.ops and layout != "hwc":  # the ops run on an (H, W, 3) row
            target, target_layout = scratch_rows(*self.output_size), "hwc"
        if sub is not None:
            crop_resize_planes(decoded, sub, header.height, header.width, (top, left, bh, bw),
                               flip, target, target_layout, interpolation)
        else:
            crop_resize(decoded, header.height, header.width, (top, left, bh, bw), flip, target,
                        target_layout, interpolation)
        if self.ops:
            result = apply_ops(self.ops, target, seed, epoch, index, self.view)
            if layout == "chw":
                split_into(result, out)
            elif result is not out:
                np.copyto(out, result)

    def apply_array(self, img: np.ndarray, *, index: int = 0, epoch: int = 0, seed: int = 0,
                    out: np.ndarray | None = None) -> np.ndarray:
        """Apply to an already-decoded (H, W, 3) uint8 RGB image; returns ``out`` (allocated
        (H, W, 3) when None)."""
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise ValueError(f"`img` must be an (H, W, 3) uint8 array. "
                             f"Found: shape {img.shape}, dtype {img.dtype}.")
        if out is None:
            out = np.empty((*self.output_size, 3), np.uint8)
        layout = _check_out(out, self.output_size)
        height, width = img.shape[:2]
        top, left, bh, bw, flip = self._box(height, width, seed, epoch, index)
        if self.ops and layout == "chw":
            hwc = scratch_rows(*self.output_size)
            crop_resize(img, height, width, (top, left, bh, bw), flip, hwc, "hwc",
                        self.sample_interpolation(seed, epoch, index))
            split_into(apply_ops(self.ops, hwc, seed, epoch, index, self.view), out)
            return out
        crop_resize(img, height, width, (top, left, bh, bw), flip, out, layout,
                    self.sample_interpolation(seed, epoch, index))
        if self.ops:
            result = apply_ops(self.ops, out, seed, epoch, index, self.view)
            if result is not out:
                np.copyto(out, result)
        return out


@dataclass(frozen=True)
class ResizeCenterCrop(ImageTransform):
    """torchvision's ``Resize(resize)`` + ``CenterCrop(size)``, computed as one crop + resize.

    ``resize`` (pixels) is the length the shorter side is resized to (the longer one becomes
    ``int(resize * long / short)``); ``size`` is the crop, an int or (height, width), and must fit
    (``resize >= max(size)``). The crop offsets are torchvision's ``int(round((h - th) / 2))``.
    """

    size: Size = 224
    resize: int = 256
    interpolation: str = "auto"
    dct_scaling: bool = True
    backend: str | None = None
    ops: tuple[RowOp, ...] = ()
    float_ops: tuple[FloatRowOp, ...] = ()
    deterministic = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _check_size(self.size))
        _set_ops(self)
        check_int("resize", self.resize, 1, rule="> 0")
        if self.resize < max(self.output_size):
            raise ValueError(f"`resize` must be >= the crop size so the crop fits. Found: "
                             f"resize={self.resize}, size={self.size}; fix: raise `resize` "
                             f"or lower `size`.")
        _check_interpolation(self.interpolation)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) in pixels of the image after torchvision's ``Resize(resize)``."""
        if width <= height:
            return int(self.resize * height / width), self.resize
        return self.resize, int(self.resize * width / height)

    def source_box(self, height: int, width: int) -> tuple[float, float, float, float]:
        """The center crop as (top, left, height, width) in (fractional) source pixels."""
        nh, nw = self.resized_size(height, width)
        th, tw = self.output_size
        top = int(round((nh - th) / 2.0))
        left = int(round((nw - tw) / 2.0))
        sy, sx = height / nh, width / nw
        return top * sy, left * sx, th * sy, tw * sx

    def _box(self, height: int, width: int, seed: int, epoch: int,
             index: int) -> tuple[float, float, float, float, bool]:
        return (*self.source_box(height, width), False)


@dataclass(frozen=True)
class Resize(ImageTransform):
    """torchvision's ``Resize((height, width))``: the whole image resized to ``size`` (an int
    or (height, width)), aspect ratio not kept. ``interpolation``, ``dct_scaling``, ``backend``,
    ``ops`` and ``float_ops`` as for :class:`ResizeCenterCrop`."""

    size: Size = 224
    interpolation: str = "auto"
    dct_scaling: bool = True
    backend: str | None = None
    ops: tuple[RowOp, ...] = ()
    float_ops: tuple[FloatRowOp, ...] = ()
    deterministic = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _check_size(self.size))
        _set_ops(self)
        _check_interpolation(self.interpolation)
        _check_backend(self.backend)

    def _box(self, height: int, width: int, seed: int, epoch: int,
             index: int) -> tuple[float, float, float, float, bool]:
        return 0.0, 0.0, float(height), float(width), False


@dataclass(frozen=True)
class RandomResizedCrop(ImageTransform):
    """torchvision's ``RandomResizedCrop`` (+ ``RandomHorizontalFlip(0.5)`` when ``flip``).

    ``scale``: range of the crop's area as a fraction of the image's; ``ratio``: range of its
    aspect ratio (width / height); ``size``: output, int or (height, width). Parameters are
    drawn as torchvision does (10 tries, then the center-crop fallback) from random numbers
    that depend only on (seed, epoch, index): :meth:`params`. ``seed`` (optional) is the seed a
    dataset uses when it applies the transform itself. ``backend``, ``dct_scaling`` and
    ``interpolation`` as for :class:`ResizeCenterCrop`.
    """

    size: Size = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    seed: int | None = None
    interpolation: str = "auto"
    dct_scaling: bool = True
    backend: str | None = None
    ops: tuple[RowOp, ...] = ()
    float_ops: tuple[FloatRowOp, ...] = ()
    deterministic = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _check_size(self.size))
        _set_ops(self)
        for name in ("scale", "ratio"):
            value = getattr(self, name)
            try:
                lo, hi = (float(v) for v in value)
            except (TypeError, ValueError):
                raise ValueError(f"`{name}` must be a pair (min, max). Found: {shorten(value)}.") from None
            if not (0 < lo <= hi and math.isfinite(hi)):
                raise ValueError(f"`{name}` must satisfy 0 < min <= max. Found: {shorten(value)}.")
            object.__setattr__(self, name, (lo, hi))
        if self.seed is not None and not isinstance(self.seed, int):
            raise TypeError(f"`seed` must be an int or None. Found: {shorten(self.seed)}.")
        _check_interpolation(self.interpolation)
        _check_backend(self.backend)

    def params(self, seed: int, epoch: int, index: int, height: int, width: int) -> CropParams:
        """The crop of sample ``index`` in ``epoch`` for an image of height x width pixels."""
        raw = _random_words(seed, epoch, index, self.view)
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        s_lo, s_hi = self.scale
        for k in range(10):
            target_area = area * (s_lo + (s_hi - s_lo) * (raw[2 * k] >> 11) * _TO_UNIT)
            aspect = math.exp(log_lo + (log_hi - log_lo) * (raw[2 * k + 1] >> 11) * _TO_UNIT)
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = min(int((raw[20] >> 11) * _TO_UNIT * (height - h + 1)), height - h)
                left = min(int((raw[21] >> 11) * _TO_UNIT * (width - w + 1)), width - w)
                return CropParams(top, left, h, w, self.flip and raw[22] >> 63 == 1)
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        h, w = max(1, min(h, height)), max(1, min(w, width))
        return CropParams((height - h) // 2, (width - w) // 2, h, w,
                          self.flip and raw[22] >> 63 == 1)

    def _box(self, height: int, width: int, seed: int, epoch: int,
             index: int) -> tuple[float, float, float, float, bool]:
        p = self.params(seed, epoch, index, height, width)
        return p.top, p.left, p.height, p.width, p.flip


_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53: (word >> 11) * _TO_UNIT is uniform in [0, 1)


def _random_words(seed: int, epoch: int, index: int, view: int = 0) -> tuple[int, ...]:
    """23 uniform 64-bit words that depend only on (seed, epoch, index, view) (SHAKE-128
    output): 2 per try (area, aspect ratio) x 10 tries, then top, left and flip. View 0 keeps
    the three-number key; view v >= 1 of a ``MultiView`` appends ``:v``."""
    key = f"gpufeed-rrc:{int(seed)}:{int(epoch)}:{int(index)}"
    if view:
        key += f":{int(view)}"
    return struct.unpack("<23Q", hashlib.shake_128(key.encode()).digest(184))


def decode_views(views: Sequence[ImageTransform], data: Buffer, index: int, epoch: int, seed: int,
                 outs: Sequence[np.ndarray], *, path: str = "auto") -> float:
    """Decode ``data`` once and write each view's output into its ``outs`` row; returns the
    seconds spent decoding. The views share the decode's settings (view 0's orientation rule and
    backend: ``MultiView`` checks they agree); the decode is at the DCT scale the most demanding
    view needs (the most source pixels per output pixel), the rule one view uses alone
    (docs/design/sample-model.md, section 2). ``path`` as for ``ImageTransform._apply``."""
    t0 = time.perf_counter()
    layouts = [_check_out(out, view.output_size) for view, out in zip(views, outs, strict=True)]
    first = views[0]
    header = read_header(data)
    if not first.apply_exif:
        header = stored_orientation(header)
    boxes = [view._box(header.height, header.width, seed, epoch, index) for view in views]
    scale = max(max(oh / box[2], ow / box[3])
                for (oh, ow), box in zip((view.output_size for view in views), boxes))
    min_h = min_w = None
    if scale < 1.0 and all(view.dct_scaling for view in views):
        min_h, min_w = min_size_for_scale(header, scale)
    sub = _decode_path(header, first.backend, min_h, min_w, path)
    decoded: Any
    if sub is not None:
        factor = choose_factor(header, min_h, min_w, first.backend)
        decoded = decode_planes(data, header=header, factor=factor)
    else:
        decoded = _decode_rgb(data, header, boxes, first.backend, min_h, min_w)
    decode_s = time.perf_counter() - t0
    for view, box, out, layout in zip(views, boxes, outs, layouts):
        view._into(decoded, sub, header, box, out, layout, seed, epoch, index)
    return decode_s


def _decode_rgb(data: Buffer, header: ImageHeader, boxes: Sequence[tuple[float, float, float, float, bool]],
                backend: str | None, min_h: int | None, min_w: int | None) -> np.ndarray:
    """``decode(data, min_height=min_h, min_width=min_w)``, but a sequential JPEG in stored
    orientation only down to the last row the ``boxes`` (top, left, height, width, ...) take
    (``decode_rows``: those rows are the full decode's, byte for byte; the rows below are left
    unwritten and never read)."""
    if backend == "opencv" or not row_decodable(data, header):
        return decode(data, min_height=min_h, min_width=min_w, header=header, backend=backend)
    factor = choose_factor(header, min_h, min_w, backend)
    h, w = scaled_size(header.height, header.width, factor)
    rows = max(crop_region(h, w, header.height, header.width, (t, left, bh, bw))[1]
               for t, left, bh, bw, _ in boxes)
    out = np.empty((h, w, 3), np.uint8)
    decode_rows(data, rows, header=header, out=out, factor=factor)
    return out


def _decode_path(header: ImageHeader, backend: str | None, min_h: int | None, min_w: int | None,
                 path: str) -> tuple[int, int] | None:
    """(sub_y, sub_x) to decode to planes, None for the RGB decode, by ``path``."""
    if path == "auto":
        return _plane_path(header, backend, min_h, min_w)
    if path == "planes":
        sub = plane_subsampling(header) if header.orientation == 1 else None
        if sub is None:
            raise ValueError(f"path='planes' needs a YCbCr or greyscale JPEG in stored "
                             f"orientation. Found: {header}.")
        return sub
    if path == "rgb":
        return None
    raise ValueError(f"`path` must be 'auto', 'rgb' or 'planes'. Found: {shorten(path)}.")


def stored_orientation(header: ImageHeader) -> ImageHeader:
    """``header`` for decoding the image as stored, its EXIF orientation ignored (as PIL's
    ``Image.open`` does, hence torchvision's datasets)."""
    if header.orientation == 1:
        return header
    return replace(header, orientation=1, height=header.encoded_height,
                   width=header.encoded_width)


def _set_ops(transform: ImageTransform) -> None:
    """Check a transform's ``ops``/``float_ops`` and store them as tuples."""
    object.__setattr__(transform, "ops", _check_ops(transform.ops, RowOp, "ops"))
    object.__setattr__(transform, "float_ops",
                       _check_ops(transform.float_ops, FloatRowOp, "float_ops"))
    if transform.ops or transform.float_ops:
        # Random rows: a decoded-row cache would repeat one draw every epoch, and a batch made
        # from cached rows by the main process (uint8, all hits) would skip the float ops.
        object.__setattr__(transform, "deterministic", False)


def _check_size(size: Size) -> tuple[int, int]:
    if is_int(size):
        pair = (size, size)
    elif isinstance(size, (tuple, list)) and len(size) == 2 and all(
            is_int(v) for v in size):
        pair = (int(size[0]), int(size[1]))
    else:
        raise ValueError(f"`size` must be an int or a (height, width) pair of ints. "
                         f"Found: {shorten(size)}.")
    if min(pair) <= 0:
        raise ValueError(f"`size` must be > 0. Found: {shorten(size)}.")
    return pair


def _check_interpolation(value: str) -> None:
    if value not in _INTERPOLATIONS:
        raise ValueError(f"`interpolation` must be one of {_INTERPOLATIONS}. Found: {shorten(value)}.")


def _check_backend(value: str | None) -> None:
    if value is not None and value not in BACKENDS:
        raise ValueError(f"`backend` must be None or one of {BACKENDS}. Found: {shorten(value)}.")


def _check_out(out: np.ndarray, size: tuple[int, int]) -> str:
    """Return "hwc" or "chw" for a valid ``out``; raise ValueError naming the problem otherwise."""
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"`out` must be a C-contiguous uint8 numpy array. Found: "
                         f"{type(out).__name__} {getattr(out, 'dtype', '')}.")
    oh, ow = size
    if out.shape == (oh, ow, 3):
        return "hwc"
    if out.shape == (3, oh, ow):
        return "chw"
    raise ValueError(f"`out` must have shape {(oh, ow, 3)} or {(3, oh, ow)}. Found: {out.shape}.")


# Chroma subsamplings (sub_y, sub_x) of YCbCr JPEGs that the plane path decodes when "auto":
# only 4:4:0, whose chroma libjpeg-turbo 2.1 upsamples without SIMD. 4:2:0, 4:2:2 and 4:4:4 were
# measured no faster than the RGB path (module docstring), so they keep it.
_PLANE_SUBSAMPLINGS = frozenset({(2, 1)})


def _plane_path(header: ImageHeader, backend: str | None, min_h: int | None,
                min_w: int | None) -> tuple[int, int] | None:
    """(sub_y, sub_x) when ``apply`` should decode this image to planes, None for the RGB path:
    a greyscale JPEG, or a 4:4:0 YCbCr JPEG decoded at full size; stored orientation, decoded by
    libjpeg-turbo."""
    if header.orientation != 1:
        return None
    sub = plane_subsampling(header)
    if sub is None or (header.colorspace != "gray" and sub not in _PLANE_SUBSAMPLINGS):
        return None
    if jpeg_decoder(header, backend) != "turbojpeg":
        return None
    if header.colorspace != "gray" and choose_factor(header, min_h, min_w, backend) != (1, 1):
        return None  # DCT-scaled chroma planes keep less colour detail: module docstring
    return sub
