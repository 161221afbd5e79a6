"""Box formats, clamping and sanitizing, with torchvision v2's semantics (0.29): the helpers the
geometric ops use, and the joint ops ``ConvertBoundingBoxFormat``, ``ClampBoundingBoxes``,
``ClampKeyPoints``, ``SanitizeBoundingBoxes``, ``SanitizeKeyPoints`` and ``SetClampingMode``.

Coordinates are float64 pixels (edges of pixels at integers, as torchvision's boxes); a box leaf
keeps its ``dtype`` name and is cast only at the output stage. A float32 leaf holds float32
values, and the steps of an op are computed in float32 as torchvision's kernels compute them
(``math_dtype``), so that thresholds (the canvas' edge in ``SanitizeBoundingBoxes``) decide as
torchvision's do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.image.detection._sample import (
    BOX_FORMATS,
    Boxes,
    JointOp,
    KeyPoints,
    Mask,
    Sample,
    is_integer_dtype,
    map_leaves,
)

__all__ = [
    "ClampBoundingBoxes",
    "ClampKeyPoints",
    "ConvertBoundingBoxFormat",
    "SanitizeBoundingBoxes",
    "SanitizeKeyPoints",
    "SetClampingMode",
    "box_format",
    "clamp_boxes",
    "convert_format",
    "first_boxes",
    "flip_boxes",
    "from_xyxy",
    "math_dtype",
    "sanitize_valid",
    "to_xyxy",
    "with_boxes",
]

CLAMPING_MODES = ("soft", "hard", None)


def box_format(fmt: Any) -> str:
    """A box format's name ("XYXY", "XYWH", "CXCYWH") from a string or a ``BoundingBoxFormat``."""
    name = getattr(fmt, "name", fmt)
    if not isinstance(name, str) or name.upper() not in BOX_FORMATS:
        raise ValueError(f"`format` must be one of {', '.join(BOX_FORMATS)}. Found: {fmt!r}.")
    return name.upper()


def math_dtype(dtype: str) -> type[np.number[Any]]:
    """The numpy type torchvision's box kernels compute a leaf of torch dtype ``dtype`` in, step
    by step: float32 (or float16) for such leaves, int64 for an integer leaf (the kernels that
    cast it to float32 first are given "float32"), else float64."""
    if is_integer_dtype(dtype):
        return np.int64
    return np.float32 if dtype == "float32" else np.float16 if dtype == "float16" else np.float64


def to_xyxy(data: np.ndarray, fmt: str, dtype: str = "float64") -> np.ndarray:
    """(N, 4) boxes in ``fmt`` as XYXY (a new float64 array), each step rounded to the leaf's
    ``dtype`` as torchvision's in-place conversion computes it (a box on the canvas' edge can
    land on either side of it by that rounding, and ``SanitizeBoundingBoxes`` then decides)."""
    integer = is_integer_dtype(dtype)  # torchvision converts it in float32, then casts it back
    out: np.ndarray = np.array(data, dtype=np.float32 if integer else math_dtype(dtype)).reshape(-1, 4)
    if fmt == "XYWH":
        out[:, 2:] += out[:, :2]
    elif fmt == "CXCYWH":
        half = out[:, 2:] / 2
        out[:, :2] -= half
        out[:, 2:] = out[:, :2] + 2 * half
    return (np.trunc(out) if integer else out).astype(np.float64)


def from_xyxy(xyxy: np.ndarray, fmt: str, dtype: str = "float64") -> np.ndarray:
    """(N, 4) XYXY boxes as ``fmt`` (a new float64 array), each step rounded to ``dtype``."""
    out: np.ndarray = np.array(xyxy, dtype=math_dtype(dtype)).reshape(-1, 4)
    if fmt == "XYWH":
        out[:, 2:] -= out[:, :2]
    elif fmt == "CXCYWH":
        wh = out[:, 2:] - out[:, :2]
        # an integer leaf's centre rounds down (torchvision's floor division)
        out[:, :2] = (out[:, :2] * 2 + wh) // 2 if is_integer_dtype(dtype) else (out[:, :2] * 2 + wh) / 2
        out[:, 2:] = wh
    return out.astype(np.float64)


def convert_format(data: np.ndarray, old: str, new: str, dtype: str = "float64") -> np.ndarray:
    """(N, 4) boxes from format ``old`` to ``new`` (float64, each step rounded to ``dtype``)."""
    if old == new:
        return np.array(data, dtype=np.float64).reshape(-1, 4)
    return from_xyxy(to_xyxy(data, old, dtype), new, dtype)


def flip_boxes(boxes: Boxes, horizontal: bool) -> np.ndarray:
    """The boxes' data flipped across their canvas as torchvision's flip kernels compute it per
    format (XYWH: the far edge's mirror, then the width kept; CXCYWH: the centre's mirror)."""
    data: np.ndarray = np.array(boxes.data, dtype=math_dtype(boxes.dtype))
    a, extent = (0, boxes.canvas[1]) if horizontal else (1, boxes.canvas[0])
    if boxes.format == "XYXY":
        data[:, [a, a + 2]] = extent - data[:, [a + 2, a]]
    elif boxes.format == "XYWH":
        data[:, a] = extent - (data[:, a] + data[:, a + 2])
    else:
        data[:, a] = extent - data[:, a]
    return data.astype(np.float64)


def with_boxes(boxes: Boxes, data: np.ndarray, canvas: tuple[int, int] | None = None) -> Boxes:
    """``boxes`` with new ``data`` (in its format) and, if given, a new canvas (H, W)."""
    return dataclasses.replace(boxes, data=data, canvas=boxes.canvas if canvas is None
                               else (int(canvas[0]), int(canvas[1])))


def clamp_boxes(boxes: Boxes, clamping_mode: str | None = "auto") -> Boxes:
    """Boxes clamped to their canvas as torchvision's ``clamp_bounding_boxes``: x in [0, W],
    y in [0, H] ("soft" and "hard" are the same for axis-aligned boxes); None leaves them;
    "auto" takes the leaf's own mode."""
    mode = boxes.clamping_mode if clamping_mode == "auto" else clamping_mode
    if mode is None:
        return boxes
    # torchvision clamps an integer leaf in float32 (and casts it back)
    dtype = "float32" if is_integer_dtype(boxes.dtype) else boxes.dtype
    xyxy = to_xyxy(boxes.data, boxes.format, dtype)
    h, w = boxes.canvas
    np.clip(xyxy[:, 0::2], 0, w, out=xyxy[:, 0::2])
    np.clip(xyxy[:, 1::2], 0, h, out=xyxy[:, 1::2])
    return with_boxes(boxes, from_xyxy(xyxy, boxes.format, dtype))


def clamp_keypoints(points: KeyPoints) -> KeyPoints:
    """Keypoints clamped to their canvas as torchvision's ``clamp_keypoints``: x in [0, W - 1],
    y in [0, H - 1]."""
    data = np.array(points.data, dtype=np.float64)
    h, w = points.canvas
    data[..., 0] = np.clip(data[..., 0], 0, w - 1)
    data[..., 1] = np.clip(data[..., 1], 0, h - 1)
    return dataclasses.replace(points, data=data)


def first_boxes(target: Any) -> Boxes | None:
    """The target's first :class:`Boxes` leaf (torchvision's ``get_bounding_boxes``), or None."""
    found: list[Boxes] = []
    map_leaves(target, lambda leaf: found.append(leaf) if isinstance(leaf, Boxes) else None)
    return found[0] if found else None


def sanitize_valid(boxes: Boxes, min_size: float = 1.0, min_area: float = 1.0) -> np.ndarray:
    """(N,) bool: the boxes ``SanitizeBoundingBoxes`` keeps (at least ``min_size`` wide and
    high, ``min_area`` in area, every XYXY coordinate >= 0 and inside the canvas)."""
    xyxy: np.ndarray = to_xyxy(boxes.data, boxes.format, boxes.dtype).astype(math_dtype(boxes.dtype))
    ws, hs = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    h, w = boxes.canvas
    valid = (ws >= min_size) & (hs >= min_size) & (xyxy >= 0).all(axis=1) & (ws * hs >= min_area)
    valid &= (xyxy[:, 0] <= w) & (xyxy[:, 2] <= w) & (xyxy[:, 1] <= h) & (xyxy[:, 3] <= h)
    return valid


@dataclass(frozen=True)
class ConvertBoundingBoxFormat(JointOp):
    """torchvision's ``ConvertBoundingBoxFormat``: every box leaf to ``format``."""

    format: Any
    name = "ConvertBoundingBoxFormat"

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", box_format(self.format))

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        def leaf(x: Any) -> Any:
            if not isinstance(x, Boxes):
                return x
            return dataclasses.replace(x, data=convert_format(x.data, x.format, self.format, x.dtype),
                                       format=self.format)

        return sample.with_target(map_leaves(sample.target, leaf))


@dataclass(frozen=True)
class ClampBoundingBoxes(JointOp):
    """torchvision's ``ClampBoundingBoxes``: ``clamping_mode`` "auto" (each leaf's own), "soft",
    "hard" or None (leave them)."""

    clamping_mode: str | None = "auto"
    name = "ClampBoundingBoxes"

    def __post_init__(self) -> None:
        if self.clamping_mode not in ("auto", *CLAMPING_MODES):
            raise ValueError("`clamping_mode` must be 'auto', 'soft', 'hard' or None. "
                             f"Found: {self.clamping_mode!r}.")

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        def leaf(x: Any) -> Any:
            return clamp_boxes(x, self.clamping_mode) if isinstance(x, Boxes) else x

        return sample.with_target(map_leaves(sample.target, leaf))


@dataclass(frozen=True)
class ClampKeyPoints(JointOp):
    """torchvision's ``ClampKeyPoints``: keypoints into [0, W - 1] x [0, H - 1]."""

    name = "ClampKeyPoints"

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        def leaf(x: Any) -> Any:
            return clamp_keypoints(x) if isinstance(x, KeyPoints) else x

        return sample.with_target(map_leaves(sample.target, leaf))


def _default_labels(inputs: Any) -> Any:
    """torchvision's default ``labels_getter``: the second item of (image, target) if it is a
    tensor/array, else its key named "labels" (any case), else the first key containing
    "label"."""
    target = inputs[1] if isinstance(inputs, (tuple, list)) else inputs
    if _is_array(target):
        return target
    if not isinstance(target, Mapping):
        raise ValueError("When using the default labels_getter, the target must be a dictionary or a "
                         f"tensor. Found: {type(target).__name__}.")
    keys = [k for k in target if isinstance(k, str)]
    key = next((k for k in keys if k.lower() == "labels"), None)
    if key is None:
        key = next((k for k in keys if "label" in k.lower()), None)
    if key is None:
        raise ValueError("Could not infer where the labels are in the sample. Pass a callable as "
                         "`labels_getter`, or labels_getter=None if there are no labels by design.")
    return target[key]


def _is_array(x: Any) -> bool:
    import torch

    return isinstance(x, (np.ndarray, torch.Tensor)) and not isinstance(x, (Boxes, KeyPoints, Mask))


def _length(x: Any) -> int:
    return len(x) if isinstance(x, list) else int(x.shape[0])


def _keep(x: Any, valid: np.ndarray) -> Any:
    """``x`` (numpy array, torch tensor or list) at the rows ``valid`` keeps."""
    if isinstance(x, list):
        return [v for v, ok in zip(x, valid) if ok]
    if isinstance(x, np.ndarray):
        return x[valid]
    import torch

    return x[torch.from_numpy(valid).to(x.device)]


class _PlaneSubset:
    """The planes ``index`` of a lazy mask source."""

    def __init__(self, base: Any, index: np.ndarray) -> None:
        self.base, self.index = base, index

    @property
    def shape(self) -> tuple[int, int, int]:
        _, h, w = self.base.shape
        return len(self.index), h, w

    def pixels(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self.base.pixels(rows, cols)[self.index]


def _keep_planes(mask: Mask, valid: np.ndarray) -> Mask:
    """``mask`` filtered along its first axis as ``tv_tensors.Mask[valid]`` is: the planes of an
    (N, H, W) mask, the rows of one (H, W) plane; unchanged if that axis is not N long."""
    n = len(valid)
    if not mask.planes:
        if mask.size[0] != n:
            return mask
        out = dataclasses.replace(mask)
        out.select(np.flatnonzero(valid), None)
        return out
    if mask.count != n:
        return mask
    index = np.flatnonzero(valid)
    if mask.data is not None:
        out = Mask(data=mask.data[index], rows=mask.rows, cols=mask.cols, fill=mask.fill)
    else:
        out = Mask(lazy=_PlaneSubset(mask.lazy, index), dtype=mask.dtype, rows=mask.rows,
                   cols=mask.cols, fill=mask.fill)
    return out


def _check_labels_getter(getter: Any) -> None:
    if not (getter in ("default", None) or callable(getter)):
        raise ValueError(f"`labels_getter` must be 'default', a callable or None. Found: {getter!r}.")


@dataclass(frozen=True)
class SanitizeBoundingBoxes(JointOp):
    """torchvision's ``SanitizeBoundingBoxes``: drops the boxes ``sanitize_valid`` rejects (by
    the target's first box leaf) from every box leaf, every mask whose first axis has one entry
    per box, and the labels.

    ``labels_getter``: "default" (the target's "labels" key, see :func:`_default_labels`), None
    (no labels), or a callable given (image, target) that returns the labels leaf, or a tuple or
    list of leaves, of the target itself (numpy arrays, torch tensors or lists)."""

    min_size: float = 1.0
    min_area: float = 1.0
    labels_getter: Callable[[Any], Any] | str | None = "default"
    name = "SanitizeBoundingBoxes"

    def __post_init__(self) -> None:
        if self.min_size < 1:
            raise ValueError(f"`min_size` must be >= 1. Found: {self.min_size}.")
        if self.min_area < 1:
            raise ValueError(f"`min_area` must be >= 1. Found: {self.min_area}.")
        _check_labels_getter(self.labels_getter)

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        boxes = first_boxes(sample.target)
        if boxes is None:
            raise ValueError("No bounding boxes were found in the sample")
        labels = _labels_of(self.labels_getter, sample, len(boxes), "boxes")
        valid = sanitize_valid(boxes, self.min_size, self.min_area)

        def leaf(x: Any) -> Any:
            if isinstance(x, Boxes):
                return with_boxes(x, x.data[valid]) if len(x) == len(valid) else x
            if isinstance(x, Mask):
                return _keep_planes(x, valid)
            return x

        return sample.with_target(_filter(sample.target, labels, valid, leaf))


def _labels_of(getter: Any, sample: Sample, n: int, what: str) -> list[Any]:
    """The leaves ``getter`` ("default", None or a callable given (image, target)) names as
    labels, each checked to have ``n`` entries (one per box or keypoint group)."""
    if getter is None:
        return []
    fn = _default_labels if getter == "default" else getter
    found = fn((sample.image, sample.target))
    if found is None:
        return []
    labels = list(found) if isinstance(found, tuple) else [found]
    for entry in labels:
        if not (_is_array(entry) or isinstance(entry, list)):
            raise ValueError(f"The labels must be arrays, tensors or lists. Found: {type(entry).__name__}.")
        if _length(entry) != n:
            raise ValueError(f"Number of {what} ({n}) must match the number of labels. "
                             f"Found labels of length {_length(entry)}.")
    return labels


def _filter(target: Any, labels: list[Any], valid: np.ndarray, leaf: Callable[[Any], Any]) -> Any:
    """``target`` with the ``labels`` (found by identity) at ``valid`` and every other leaf
    through ``leaf``."""

    def walk(x: Any) -> Any:
        # Labels first: a list of labels is a subtree to map_leaves, one leaf here.
        if any(x is entry for entry in labels):
            return _keep(x, valid)
        if isinstance(x, (dict, list, tuple)):
            return map_leaves(x, walk) if not _holds(x, labels) else _map_children(x, walk)
        return leaf(x)

    return walk(target)


def _holds(tree: Any, entries: list[Any]) -> bool:
    """Whether ``tree`` holds one of ``entries`` (by identity) as a subtree."""
    if any(tree is e for e in entries):
        return True
    children = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return any(_holds(c, entries) for c in children)


def _map_children(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` (a dict, list or tuple) with each child replaced by ``fn(child)``."""
    if isinstance(tree, dict):
        return {k: fn(v) for k, v in tree.items()} if type(tree) is dict \
            else type(tree)((k, fn(v)) for k, v in tree.items())
    items = [fn(v) for v in tree]
    if isinstance(tree, list):
        return items
    return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)


@dataclass(frozen=True)
class SanitizeKeyPoints(JointOp):
    """torchvision's ``SanitizeKeyPoints``: drops the keypoints (or groups: the first axis of an
    (N, K, 2) leaf) with a point outside [0, W) x [0, H) of the target's first keypoints leaf,
    from every keypoints leaf and the labels (``labels_getter`` as for
    :class:`SanitizeBoundingBoxes`, None by default)."""

    labels_getter: Callable[[Any], Any] | str | None = None
    name = "SanitizeKeyPoints"

    def __post_init__(self) -> None:
        _check_labels_getter(self.labels_getter)

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        found: list[KeyPoints] = []
        map_leaves(sample.target, lambda x: found.append(x) if isinstance(x, KeyPoints) else None)
        if not found:
            raise ValueError("No keypoints were found in the sample")
        points = found[0]
        h, w = points.canvas
        x, y = points.data[..., 0], points.data[..., 1]
        inside = np.asarray((x >= 0) & (x < w) & (y >= 0) & (y < h))
        valid = np.asarray(inside.reshape(len(inside), -1).all(axis=1) if inside.ndim > 1 else inside)
        labels = _labels_of(self.labels_getter, sample, len(valid), "keypoints")

        def leaf(x: Any) -> Any:
            if isinstance(x, KeyPoints):
                if len(x.data) != len(valid):
                    raise IndexError(f"keypoints of length {len(x.data)} cannot be filtered by {len(valid)} flags")
                return dataclasses.replace(x, data=x.data[valid])
            return x

        return sample.with_target(_filter(sample.target, labels, valid, leaf))


@dataclass(frozen=True)
class SetClampingMode(JointOp):
    """torchvision's ``SetClampingMode``: every box leaf's ``clamping_mode`` for the ops after
    ("soft", "hard" or None)."""

    clamping_mode: str | None
    name = "SetClampingMode"

    def __post_init__(self) -> None:
        if self.clamping_mode not in CLAMPING_MODES:
            raise ValueError(f"`clamping_mode` must be 'soft', 'hard' or None. Found: {self.clamping_mode!r}.")

    def draw(self, rng: np.random.Generator, sample: Sample) -> Any:
        return {}

    def apply(self, sample: Sample, params: Any) -> Sample:
        def leaf(x: Any) -> Any:
            return dataclasses.replace(x, clamping_mode=self.clamping_mode) if isinstance(x, Boxes) else x

        return sample.with_target(map_leaves(sample.target, leaf))
