"""A detection/segmentation sample as the joint ops see it in a worker: the decoded image and
its target's typed leaves (boxes, masks, keypoints), in numpy, with torchvision v2's meaning.

The image is an (H, W, 3) uint8 RGB array (HWC) until the pipeline's end. A target is any
pytree (dict, list, tuple) whose leaves are :class:`Boxes`, :class:`Mask`, :class:`KeyPoints`
or anything else (labels, ids: carried as they are; ``SanitizeBoundingBoxes`` filters the
labels it finds). A joint op draws its parameters once per sample (``JointOp.draw``) and
applies them to the image and to every leaf (``JointOp.apply``), as a torchvision v2 transform
does. Masks are not resampled op by op: nearest-neighbour geometry (crop, pad, flip, resize)
composes row and column index maps (:meth:`Mask.select`), and only the pixels the output keeps
are read at the end (:meth:`Mask.dense`), from a dense array or from a lazy decoder (COCO RLE).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = [
    "BOX_FORMATS",
    "Boxes",
    "ImageWindow",
    "JointOp",
    "KeyPoints",
    "LazyPlanes",
    "Mask",
    "PixelOp",
    "RowSource",
    "Sample",
    "map_leaves",
    "sample_rng",
    "torch_nearest_index",
]

#: A point op on an image's pixels: takes a C-contiguous (H, W, 3) uint8 array it may write,
#: returns the result (each output pixel a function of that input pixel alone, so that it may run
#: on any part of the image: a window's source part, :meth:`ImageWindow.with_ops`).
PixelOp = Callable[[np.ndarray], np.ndarray]

#: The axis-aligned box formats the joint ops transform (torchvision's ``BoundingBoxFormat``
#: names); rotated formats are out of scope (a pipeline with them runs its ops as given).
BOX_FORMATS = ("XYXY", "XYWH", "CXCYWH")


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's joint-op parameters: SHAKE-128 of (seed, epoch, index)
    under a key of its own seeds a PCG64, so the draws are the same in any process."""
    key = f"gpufeed-joint:{int(seed)}:{int(epoch)}:{int(index)}"
    words = struct.unpack("<4I", hashlib.shake_128(key.encode()).digest(16))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(words))))


def torch_nearest_index(in_size: int, out_size: int) -> np.ndarray:
    """Source index of each output index under torch's ``interpolate(mode="nearest")`` (what
    torchvision v2 resizes masks with): ``min(floor(dst * (in / out)), in - 1)`` in float32,
    with torch's shortcuts for equal and doubled sizes."""
    dst = np.arange(out_size, dtype=np.int64)
    if out_size == in_size:
        return dst
    if out_size == 2 * in_size:
        return dst >> 1
    scale = np.float32(in_size) / np.float32(out_size)
    src = np.floor(dst.astype(np.float32) * scale).astype(np.int64)
    return np.minimum(src, in_size - 1)


def _rounded(data: np.ndarray, dtype: str) -> np.ndarray:
    """float64 ``data`` rounded to the values of ``dtype``: each op's result then equals
    torchvision's, which computes in the leaf's dtype (a float64 sum or product of float32
    values rounds once to the float32 one) and casts an integer leaf back after every op
    (``.to(int64)``: towards zero)."""
    if dtype in ("float32", "float16"):
        return data.astype(dtype).astype(np.float64)
    if is_integer_dtype(dtype):
        return np.trunc(data)
    return data


@functools.cache
def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, cached (numpy builds the name anew each time: 10 us)."""
    return str(dtype)


def is_integer_dtype(dtype: str) -> bool:
    """Whether a leaf's dtype name (torch's: ``"int64"``, ``"uint8"``...) is an integer type."""
    return dtype.startswith(("int", "uint"))


@dataclass
class Boxes:
    """``tv_tensors.BoundingBoxes`` in numpy: ``data`` (N, 4) float64 in ``format``, on a
    ``canvas`` of (H, W) pixels. ``dtype``: the torch dtype name the leaf leaves as
    (``"float32"`` for COCO). ``clamping_mode``: torchvision's ``"soft"``, ``"hard"`` or None."""

    data: np.ndarray
    format: str
    canvas: tuple[int, int]
    clamping_mode: str | None = "soft"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.format not in BOX_FORMATS:
            raise ValueError(f"box format must be one of {', '.join(BOX_FORMATS)} (rotated formats "
                             f"run their ops as given). Found: {self.format!r}.")
        self.data = _rounded(np.asarray(self.data, dtype=np.float64).reshape(-1, 4), self.dtype)

    def __len__(self) -> int:
        return len(self.data)


@dataclass
class KeyPoints:
    """``tv_tensors.KeyPoints`` in numpy: ``data`` (..., 2) float64 (x, y) on a ``canvas`` of
    (H, W) pixels; ``dtype`` as for :class:`Boxes`."""

    data: np.ndarray
    canvas: tuple[int, int]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        self.data = _rounded(np.asarray(self.data, dtype=np.float64), self.dtype)


class LazyPlanes(Protocol):
    """Mask planes decoded only where asked (e.g. COCO polygons/RLE, rasterised at the source
    size as pycocotools does): ``shape`` is (N, H, W) at the source."""

    @property
    def shape(self) -> tuple[int, int, int]: ...

    def pixels(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """(N, len(rows), len(cols)) uint8: planes at the given source rows and columns (each
        in range)."""


@dataclass
class Mask:
    """``tv_tensors.Mask``: one plane (H, W) or N planes (N, H, W) of ``dtype`` (a numpy dtype
    name), dense (``data``) or lazy (``lazy``), seen through index maps.

    ``rows``/``cols``: for each output row/column, the source row/column it copies, -1 where it
    is ``fill`` (padding); None is the identity. Nearest-neighbour ops compose these maps
    (:meth:`select`) instead of moving pixels; :meth:`dense` reads the output once. An op that
    is not a selection (affine warps) calls :meth:`dense` first and sets ``data``.
    """

    data: np.ndarray | None = None
    lazy: LazyPlanes | None = None
    planes: bool = True  # (N, H, W); False: one (H, W) plane
    dtype: str = "uint8"
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None
    fill: float = 0
    _source_hw: tuple[int, int] = field(default=(0, 0), init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.data is None) == (self.lazy is None):
            raise ValueError("a Mask takes exactly one of `data` (an array) and `lazy`")
        if self.data is not None:
            self.planes = self.data.ndim == 3
            self.dtype = _dtype_name(self.data.dtype)
            self._source_hw = (int(self.data.shape[-2]), int(self.data.shape[-1]))
        else:
            assert self.lazy is not None
            self._source_hw = (int(self.lazy.shape[1]), int(self.lazy.shape[2]))

    @property
    def count(self) -> int:
        """Planes (1 for a single plane)."""
        if self.data is not None:
            return self.data.shape[0] if self.planes else 1
        assert self.lazy is not None
        return self.lazy.shape[0]

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the output as the maps stand."""
        h = self._source_hw[0] if self.rows is None else len(self.rows)
        w = self._source_hw[1] if self.cols is None else len(self.cols)
        return h, w

    def _maps(self) -> tuple[np.ndarray, np.ndarray]:
        rows = np.arange(self._source_hw[0]) if self.rows is None else self.rows
        cols = np.arange(self._source_hw[1]) if self.cols is None else self.cols
        return rows, cols

    def select(self, rows: np.ndarray | None, cols: np.ndarray | None, fill: float | None = None) -> None:
        """Compose a selection: output row i is current row ``rows[i]`` (-1: ``fill``), the same
        for columns; None keeps that axis. A ``fill`` other than the pending one materialises
        the mask first (one fill value per map)."""
        pending = self.rows is not None and bool((self.rows < 0).any()) or \
            self.cols is not None and bool((self.cols < 0).any())
        if fill is not None and fill != self.fill and pending:
            self.materialize()
        if fill is not None:
            self.fill = fill
        if rows is not None:
            self.rows = _compose(self.rows, rows)
        if cols is not None:
            self.cols = _compose(self.cols, cols)

    def dense(self) -> np.ndarray:
        """The output planes as an array ((N, H, W), or (H, W) for one plane), in ``dtype``."""
        if self.rows is None and self.cols is None and self.data is not None:
            return self.data
        rows, cols = self._maps()
        r_ok, c_ok = rows >= 0, cols >= 0
        if self.data is not None and r_ok.all() and c_ok.all():  # nothing padded: two gathers
            out = _take(self.data if self.planes else self.data[None], self.rows, self.cols)
            return out if self.planes else out[0]
        out = np.full((self.count, len(rows), len(cols)), self.fill, dtype=self.dtype)
        if r_ok.any() and c_ok.any():
            rr, cc = rows[r_ok], cols[c_ok]
            if self.data is not None:
                got = _take(self.data if self.planes else self.data[None], rr, cc)
            else:
                assert self.lazy is not None
                got = self.lazy.pixels(rr, cc)
            at_r, at_c = _span(r_ok), _span(c_ok)
            if isinstance(at_r, np.ndarray) and isinstance(at_c, np.ndarray):
                at_r = at_r[:, None]  # (a grid)
            out[:, at_r, at_c] = got
        return out if self.planes else out[0]

    def materialize(self) -> np.ndarray:
        """Read the output into ``data`` (dropping the maps and the lazy source); returns it."""
        data = self.dense()
        self.data, self.lazy, self.rows, self.cols = data, None, None, None
        self._source_hw = (int(data.shape[-2]), int(data.shape[-1]))
        return data


def _compose(current: np.ndarray | None, index: Any) -> np.ndarray:
    """Map ``index`` (positions in the current output, negative: fill) through ``current``
    (source positions, -1: fill; None: the identity) to source positions, -1 for fill."""
    index = np.asarray(index, dtype=np.int64)
    if current is None:
        return np.maximum(index, -1)
    return np.where(index < 0, -1, current[np.maximum(index, 0)])


def _take(src: np.ndarray, rows: np.ndarray | None, cols: np.ndarray | None) -> np.ndarray:
    """``src[:, rows][:, :, cols]`` (None: the whole axis; every index in range), the axis that
    shrinks most gathered first."""
    # np.take, not indexing: src[..., cols] is faster alone but comes out column-major, and
    # making it contiguous for the output costs more than it saved (86 against 103 us for
    # 256 x 256 of a 556 x 562 plane, read out contiguous).
    h, w = src.shape[-2:]
    if rows is not None and (cols is None or len(rows) * w <= h * len(cols)):
        src = np.take(src, rows, axis=-2)
        rows = None
    if cols is not None:
        src = np.take(src, cols, axis=-1)
    return src if rows is None else np.take(src, rows, axis=-2)


def _span(ok: np.ndarray) -> slice | np.ndarray:
    """The output positions where ``ok``: a slice when they are one run (padding on the
    sides), else their indices (on a grid with the other axis's)."""
    at = np.flatnonzero(ok)
    if at[-1] - at[0] + 1 == len(at):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


class RowSource(Protocol):
    """A source image (H, W, 3) uint8 that is decoded on demand, from the top: ``rows(stop)``
    gives an (H, W, 3) array whose rows [0, ``stop``) are the image's (the others are not
    read). A window over one decodes only down to its bottom row when materialised."""

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, 3)."""
        ...

    def rows(self, stop: int) -> np.ndarray:
        """The image array, valid in rows [0, ``stop``)."""
        ...


class ImageWindow:
    """A pending window over a source image (H, W, 3) uint8 (an array or a :class:`RowSource`):
    the source rectangle rows
    ``y0:y1``, columns ``x0:x1``, bordered by ``margins`` (top, bottom, left, right) of
    ``fill`` (uint8 per channel), then flipped (``hflip``, ``vflip``). Constant pads and crops
    (also into the margins) and flips compose it (:meth:`crop`, :meth:`flip`) without touching
    pixels; :meth:`materialize` allocates the window's size only, copies the source part and
    fills the margins (a window with no margins, no flip and no ``ops`` is a view of the source).

    ``ops``: pending point ops (:data:`PixelOp`, in order) on the source's pixels, run at
    materialisation on the source part only (a copy: the source is never written), never on the
    margins, which are filled after them: a photometric op before a zoom-out and an IoU crop
    computes only the pixels the crop keeps."""

    __slots__ = ("src", "y0", "y1", "x0", "x1", "margins", "fill", "hflip", "vflip", "ops")

    def __init__(self, src: np.ndarray | RowSource, rect: tuple[int, int, int, int],
                 margins: tuple[int, int, int, int] = (0, 0, 0, 0),
                 fill: tuple[int, ...] = (0, 0, 0), hflip: bool = False, vflip: bool = False,
                 ops: tuple[PixelOp, ...] = ()) -> None:
        self.src = src
        self.y0, self.y1, self.x0, self.x1 = rect
        self.margins = margins
        self.fill = fill
        self.hflip, self.vflip = hflip, vflip
        self.ops = ops

    @classmethod
    def over(cls, image: np.ndarray) -> ImageWindow | None:
        """The identity window over ``image``; None when it is not (H, W, 3) uint8."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            return None
        return cls(image, (0, image.shape[0], 0, image.shape[1]))

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the window."""
        top, bottom, left, right = self.margins
        return top + self.y1 - self.y0 + bottom, left + self.x1 - self.x0 + right

    def crop(self, top: int, left: int, h: int, w: int, fill: tuple[int, ...]) -> ImageWindow:
        """The window (top, left, h, w) of this one (``F.crop``/constant ``F.pad``: ``fill``
        outside it). Where this window has margins of another fill that the new one keeps and
        it reaches outside them too, this window is materialised first (one fill per window)."""
        wh, ww = self.size
        within = top >= 0 and left >= 0 and top + h <= wh and left + w <= ww
        if not within and fill != self.fill and any(self.margins):
            return ImageWindow(self.materialize(), (0, wh, 0, ww), fill=fill).crop(top, left, h, w, fill)
        if self.hflip:
            left = ww - left - w
        if self.vflip:
            top = wh - top - h
        mt, mb, ml, mr = self.margins
        rows = _axis(top, h, mt, self.y0, self.y1)
        cols = _axis(left, w, ml, self.x0, self.x1)
        if rows is None or cols is None:  # nothing of the source: all fill
            rect, margins = (self.y0, self.y0, self.x0, self.x0), (h, 0, w, 0)
        else:
            rect = (rows[0], rows[1], cols[0], cols[1])
            margins = (rows[2], rows[3], cols[2], cols[3])
        return ImageWindow(self.src, rect, margins, self.fill if within else fill, self.hflip, self.vflip,
                           self.ops)

    def flip(self, horizontal: bool) -> ImageWindow:
        """This window flipped left-right (or top-bottom)."""
        return ImageWindow(self.src, (self.y0, self.y1, self.x0, self.x1), self.margins, self.fill,
                           self.hflip != horizontal, self.vflip != (not horizontal), self.ops)

    def with_ops(self, ops: Sequence[PixelOp]) -> ImageWindow:
        """This window with point ``ops`` run after its pending ones; only a window without
        margins takes them (the margins' fill must not go through them): ValueError otherwise."""
        if any(self.margins):
            raise ValueError("point ops on a window with margins would miss its fill pixels: "
                             "materialise it first")
        return ImageWindow(self.src, (self.y0, self.y1, self.x0, self.x1), self.margins, self.fill,
                           self.hflip, self.vflip, (*self.ops, *ops))

    def source_part(self) -> np.ndarray:
        """The source rectangle, its pending ops run (on a copy): a view where there are none.
        A :class:`RowSource` is asked for the rows down to the rectangle's bottom only."""
        src = self.src
        if not isinstance(src, np.ndarray):
            src = src.rows(self.y1 if self.y1 > self.y0 and self.x1 > self.x0 else 0)
        part = src[self.y0:self.y1, self.x0:self.x1]
        if not self.ops or part.size == 0:
            return part
        part = np.array(part, order="C")
        for op in self.ops:
            part = op(part)
        return part

    def materialize(self) -> np.ndarray:
        """The window's pixels, (H, W, 3) uint8."""
        import cv2

        code = -1 if self.hflip and self.vflip else 1 if self.hflip else 0 if self.vflip else None
        part = self.source_part()
        if not any(self.margins):
            return part if code is None else cv2.flip(part, code)
        mt, mb, ml, mr = self.margins
        if self.hflip:
            ml, mr = mr, ml
        if self.vflip:
            mt, mb = mb, mt
        h, w = self.size
        out = np.empty((h, w, 3), np.uint8)
        row = np.empty((w, 3), np.uint8)  # one row of fill: rows copy at memcpy speed (a 3-tuple
        row[:] = self.fill  # broadcast pixel by pixel is 50x slower)
        if part.size == 0:
            out[:] = row
            return out
        out[:mt] = row
        out[h - mb:] = row
        out[mt:h - mb, :ml] = row[:ml]
        out[mt:h - mb, w - mr:] = row[w - mr:]
        view = out[mt:h - mb, ml:w - mr]
        if code is None:
            view[...] = part
        else:
            got = cv2.flip(part, code, dst=view)
            if not np.may_share_memory(got, view):
                view[...] = got
        return out


def _axis(start: int, length: int, margin: int, s0: int, s1: int) -> tuple[int, int, int, int] | None:
    """One axis of a crop of a window: (source start, source end, margin before, margin after),
    None when the crop holds none of the source."""
    a, b = max(start, margin), min(start + length, margin + s1 - s0)
    if a >= b:
        return None
    return s0 + a - margin, s0 + b - margin, a - start, start + length - b


_PENDING = np.empty((0, 0, 3), np.uint8)  # a windowed sample's array until it is materialised


class Sample:
    """One sample in a worker: ``image`` (H, W, 3) uint8 RGB, ``target`` a pytree of leaves.

    The image may be a pending :class:`ImageWindow` (crops, constant pads and flips compose it,
    :meth:`image_window`, :meth:`windowed`): reading ``image`` materialises it once."""

    __slots__ = ("_image", "_window", "target")

    def __init__(self, image: np.ndarray, target: Any) -> None:
        self._image = image
        self._window: ImageWindow | None = None
        self.target = target

    @classmethod
    def windowed(cls, window: ImageWindow, target: Any) -> Sample:
        """A sample whose image is ``window``, materialised when read."""
        out = cls(window.src if isinstance(window.src, np.ndarray) else _PENDING, target)
        out._window = window
        return out

    @classmethod
    def over_rows(cls, source: RowSource, target: Any) -> Sample:
        """A sample whose image is ``source``, decoded when (and as far down as) read."""
        h, w = source.shape[:2]
        return cls.windowed(ImageWindow(source, (0, h, 0, w)), target)

    @property
    def image(self) -> np.ndarray:
        """The image as an array (a pending window is materialised here, once)."""
        if self._window is not None:
            self._image, self._window = self._window.materialize(), None
        return self._image

    @image.setter
    def image(self, value: np.ndarray) -> None:
        self._image, self._window = value, None

    def image_window(self) -> ImageWindow | None:
        """The image as a window (pending, or the identity over the array) to compose without
        reading pixels; None when the image is not (H, W, 3) uint8."""
        return self._window if self._window is not None else ImageWindow.over(self._image)

    def with_target(self, target: Any) -> Sample:
        """This image (pending window included) with another target."""
        out = Sample(self._image, target)
        out._window = self._window
        return out

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the image."""
        if self._window is not None:
            return self._window.size
        return self._image.shape[0], self._image.shape[1]

    def __repr__(self) -> str:
        return f"Sample(size={self.size}, target={self.target!r})"

    def leaves(self) -> list[Any]:
        """The target's leaves, depth first (dict values in order)."""
        out: list[Any] = []

        def keep(leaf: Any) -> Any:
            out.append(leaf)
            return leaf

        map_leaves(self.target, keep)
        return out


def map_leaves(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` with every leaf replaced by ``fn(leaf)``: dicts, lists and tuples (namedtuples
    too) are walked, anything else is a leaf."""
    if isinstance(tree, dict):
        return type(tree)((k, map_leaves(v, fn)) for k, v in tree.items()) if type(tree) is not dict \
            else {k: map_leaves(v, fn) for k, v in tree.items()}
    if isinstance(tree, list):
        return [map_leaves(v, fn) for v in tree]
    if isinstance(tree, tuple):
        items = [map_leaves(v, fn) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)
    return fn(tree)


class JointOp(ABC):
    """A transform of the image and its target together, with torchvision v2's semantics.

    Subclasses are named like the torchvision op they stand for and take its constructor
    arguments (so a translation is a lookup). ``draw`` returns the parameters for one sample
    (None: the op leaves this sample unchanged, e.g. a flip not taken); ``apply`` returns the
    transformed sample (it may change the one given)."""

    name: str = ""

    @abstractmethod
    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        """This sample's parameters, from ``rng`` (and the sample's sizes or boxes)."""

    @abstractmethod
    def apply(self, sample: Sample, params: Any) -> Sample:
        """The sample with ``params`` applied to its image and every leaf."""

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        params = self.draw(rng, sample)
        return sample if params is None else self.apply(sample, params)
