"""``CocoDetection``: COCO instances (boxes, labels, masks) as torchvision's ``CocoDetection``
wrapped by ``wrap_dataset_for_transforms_v2`` returns them, on gpufeed's detection path.

The annotation file is parsed once, at construction, into flat numpy arrays (image ids, paths,
per-image annotation offsets, boxes, categories, crowd flags, areas, segmentations as one
coordinate array, one run-length array and one byte blob): no per-annotation Python object is
kept, so a dataset pickled into workers is a few arrays (shared with spawned workers when large,
see ``gpufeed.sources._shared``), not COCO's dict of dicts.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

import numpy as np
import torch

from gpufeed.decoders import read_header
from gpufeed.decoders._header import Buffer
from gpufeed.errors import DecodeError
from gpufeed.image.detection._sample import Boxes, Mask
from gpufeed.sources._coco_masks import CocoPlanes, rle_counts, rle_string, segmentation_rle
from gpufeed.sources._detection import DetectionSource
from gpufeed.sources._detection_items import (
    check_transform_args,
    open_pil,
    source_item,
    to_torchvision,
)
from gpufeed.sources._paths import PathTable
from gpufeed.sources._read_options import DEFAULT_READ_BUDGET_BYTES
from gpufeed.sources._shared import share

__all__ = ["CocoDetection"]

# Segmentation kinds: a list of polygons, an RLE with list counts, an RLE with string counts.
POLYGONS, RLE_LIST, RLE_STRING, NO_SEGMENTATION = 0, 1, 2, 3
SIZE_FIRST = 0x10  # flag on an RLE's kind: its JSON object lists `size` before `counts`
# Bits of `_missing`: the annotation lacks this optional key.
_MISSING_BITS = {"area": 1, "iscrowd": 2, "segmentation": 4}
_WRAPPER_KEYS = {"image_id", "boxes", "masks", "labels"}


def _target_keys(target_keys: Any) -> set[str]:
    """torchvision's ``parse_target_keys`` for ``CocoDetection`` (the same sets, so the extra
    keys come out in the same order as the wrapped torchvision dataset's)."""
    available = {"segmentation", "area", "iscrowd", "image_id", "bbox", "category_id",
                 "boxes", "masks", "labels"}
    if target_keys is None:
        target_keys = {"image_id", "boxes", "labels"}
    if target_keys == "all":
        return available
    if isinstance(target_keys, str):
        raise ValueError(f"`target_keys` must be None, 'all' or a collection of keys. "
                         f"Found: {target_keys!r}.")
    keys = set(target_keys)
    extra = keys - available
    if extra:
        raise ValueError(f"Target keys {sorted(extra)} are not available")
    return keys


class _Parser:
    """One pass over the annotation JSON into flat lists (then arrays)."""

    def __init__(self, ann_file: str) -> None:
        self.ann_file = ann_file
        self.bbox: list[list[float]] = []
        self.bbox_int: list[bool] = []
        self.category: list[int] = []
        self.iscrowd: list[int] = []
        self.area: list[float] = []
        self.area_int: list[bool] = []
        self.missing: list[int] = []
        self.kind: list[int] = []
        self.seg_lo: list[int] = []
        self.seg_hi: list[int] = []
        self.seg_size: list[tuple[int, int]] = []
        self.coords: list[float] = []
        self.poly_ends: list[int] = []
        self.rle_blob = bytearray()

    def fail(self, where: str, what: str) -> ValueError:
        return ValueError(f"{self.ann_file}: `{where}` {what}")

    def annotation(self, j: int, ann: Any) -> None:
        where = f"annotations[{j}]"
        if not isinstance(ann, dict):
            raise self.fail(where, f"must be an object. Found: {type(ann).__name__}.")
        bbox = ann.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
            raise self.fail(f"{where}.bbox", f"must be 4 numbers [x, y, w, h]. Found: {bbox!r}.")
        self.bbox.append(bbox)
        self.bbox_int.append(all(isinstance(v, int) for v in bbox))
        cat = ann.get("category_id")
        if not isinstance(cat, int) or isinstance(cat, bool):
            raise self.fail(f"{where}.category_id", f"must be an integer. Found: {cat!r}.")
        self.category.append(cat)
        missing = 0
        crowd = ann.get("iscrowd")
        if crowd is None:
            missing |= _MISSING_BITS["iscrowd"]
        elif not isinstance(crowd, int):
            raise self.fail(f"{where}.iscrowd", f"must be 0 or 1. Found: {crowd!r}.")
        self.iscrowd.append(int(crowd or 0))
        area = ann.get("area")
        if area is None:
            missing |= _MISSING_BITS["area"]
        elif not isinstance(area, (int, float)):
            raise self.fail(f"{where}.area", f"must be a number. Found: {area!r}.")
        self.area.append(float(area or 0.0))
        self.area_int.append(isinstance(area, int))
        seg = ann.get("segmentation")
        if seg is None:
            missing |= _MISSING_BITS["segmentation"]
        self.missing.append(missing)
        self.segmentation(f"{where}.segmentation", seg)

    def segmentation(self, where: str, seg: Any) -> None:
        size, size_first = (0, 0), False
        if seg is None:
            kind, lo, hi = NO_SEGMENTATION, 0, 0
        elif isinstance(seg, list):
            kind, lo = POLYGONS, len(self.poly_ends)
            for poly in seg:
                if not isinstance(poly, list) or not all(isinstance(v, (int, float)) for v in poly):
                    raise self.fail(where, f"must be a list of polygons [x0, y0, x1, y1, ...] or "
                                           f"an RLE object. Found: {str(seg)[:80]}.")
                self.coords.extend(poly)
                self.poly_ends.append(len(self.coords))
            hi = len(self.poly_ends)
        elif isinstance(seg, dict):
            counts, got = seg.get("counts"), seg.get("size")
            if not (isinstance(got, list) and len(got) == 2 and all(isinstance(v, int) for v in got)):
                raise self.fail(f"{where}.size", f"must be [height, width]. Found: {got!r}.")
            size = (got[0], got[1])
            keys = list(seg)
            size_first = "counts" in seg and keys.index("size") < keys.index("counts")
            if isinstance(counts, str):
                kind, lo = RLE_STRING, len(self.rle_blob)
                self.rle_blob += counts.encode("ascii")
                hi = len(self.rle_blob)
            elif isinstance(counts, list) and all(
                    isinstance(v, int) and 0 <= v < 1 << 32 for v in counts):
                # kept compressed (lossless for run lengths); the list is rebuilt on request
                kind, lo = RLE_LIST, len(self.rle_blob)
                self.rle_blob += rle_string(counts)
                hi = len(self.rle_blob)
            else:
                raise self.fail(f"{where}.counts", f"must be a string or a list of run lengths "
                                                   f"(0 to 2**32 - 1). "
                                                   f"Found: {str(counts)[:80]}.")
        else:
            raise self.fail(where, f"must be a list of polygons or an RLE object. "
                                   f"Found: {type(seg).__name__}.")
        self.kind.append(kind | (SIZE_FIRST if isinstance(seg, dict) and size_first else 0))
        self.seg_lo.append(lo)
        self.seg_hi.append(hi)
        self.seg_size.append(size)


def _read_json(ann_file: str) -> dict[str, Any]:
    with open(ann_file, "rb") as f:
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{ann_file}: not a valid JSON file ({exc}).") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{ann_file}: a COCO annotation file holds a JSON object with `images` "
                         f"and `annotations`. Found: a JSON {type(data).__name__}.")
    for key in ("images", "annotations"):
        if not isinstance(data.get(key, []), list):
            raise ValueError(f"{ann_file}: `{key}` must be a list. "
                             f"Found: {type(data[key]).__name__}.")
    return data


def _torchvision_key_order(target_keys: Any) -> tuple[str, ...] | None:
    """The order of the raw keys in torchvision's wrapped ``CocoDetection`` targets (the keys
    its wrapper factory parsed, less the ones it adds), or None where that cannot be read."""
    try:
        wrapper_module = importlib.import_module("torchvision.tv_tensors._dataset_wrapper")
        datasets = importlib.import_module("torchvision.datasets")
        wrapper = wrapper_module.WRAPPER_FACTORIES[datasets.CocoDetection](None, target_keys)
        cells = dict(zip(wrapper.__code__.co_freevars,
                         (c.cell_contents for c in wrapper.__closure__ or ())))
        return tuple(cells["target_keys"] - _WRAPPER_KEYS)
    except Exception:  # noqa: BLE001 - another torchvision: the fixed order
        return None


def _compact_coords(coords: np.ndarray) -> np.ndarray:
    """Polygon coordinates as int32 hundredths where that is lossless (COCO's are given to two
    decimals: ``round(x * 100) / 100`` is then the same double as ``x``), else float64."""
    if coords.size and np.abs(coords).max() < 2**31 / 100:
        centi = np.round(coords * 100)
        if np.array_equal(centi / 100.0, coords):
            return centi.astype(np.int32)
    return coords


def _stated_size(img: dict[str, Any]) -> tuple[int, int]:
    """(height, width) of an ``images`` entry; (-1, -1) when absent or not positive ints (the
    file's header says it then)."""
    h, w = img.get("height"), img.get("width")
    if isinstance(h, int) and isinstance(w, int) and not isinstance(h, bool) and not isinstance(w, bool) \
            and h > 0 and w > 0:
        return h, w
    return -1, -1


class CocoDetection(DetectionSource):
    """COCO detection/instance segmentation: the images under ``root`` named by ``annFile``'s
    ``images``, with their ``annotations``.

    Samples equal those of ``wrap_dataset_for_transforms_v2(torchvision.datasets.CocoDetection(
    root, annFile), target_keys=target_keys)``: images in sorted image-id order; the target a
    dict with ``image_id``, ``boxes`` (``BoundingBoxes`` XYXY on the image's (H, W), float32, or
    int64 where every box of the image is given in integers), ``masks`` (``Mask`` (N, H, W)
    uint8, from polygons or RLE), ``labels`` (int64 category ids) and the raw keys asked for
    (``segmentation``, ``area``, ``iscrowd``, ``bbox``, ``category_id``: lists, one entry per
    annotation); ``target_keys`` None is {"image_id", "boxes", "labels"}, "all" is every key.
    An image without annotations has ``{"image_id": id}``.

    ``transforms``: None, a gpufeed :class:`~gpufeed.image.detection.DetectionPipeline`
    (decoded by gpufeed, joint ops drawn per (seed, epoch, index)) or a callable taking
    (PIL image, target). ``transform``/``target_transform``: callables on the image / the target
    (not with ``transforms``). Without a pipeline the image is ``PIL.Image.open(path)
    .convert("RGB")`` (EXIF orientation ignored, as torchvision) and the target's leaves are
    ``tv_tensors``; without torchvision installed they are plain tensors. A torchvision v2
    pipeline given as ``transforms`` is translated (``translate_detection``) to the fast path.

    ``read_concurrency`` / ``read_budget_bytes``: reads in flight per worker and their byte
    budget, as for :class:`~gpufeed.sources.ImageSource` (None: read ahead once reads stall).
    """

    def __init__(self, root: str | os.PathLike, annFile: str | os.PathLike,  # noqa: N803 - torchvision's name
                 transform: Any = None, target_transform: Any = None, transforms: Any = None,
                 target_keys: Any = None, *, read_concurrency: int | None = None,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES) -> None:
        check_transform_args(transform, target_transform, transforms)
        self.set_read_options(read_concurrency, read_budget_bytes)
        self.root = os.fspath(root)
        self.ann_file = os.fspath(annFile)
        self.transform = transform
        self.target_transform = target_transform
        self.transforms = transforms
        keys = _target_keys(target_keys)
        self.target_keys = frozenset(keys)
        self._target_keys_arg = target_keys if target_keys is None or isinstance(target_keys, str) \
            else tuple(target_keys)
        self._extra_keys = tuple(keys - _WRAPPER_KEYS)
        self._extra_order: tuple[int, tuple[str, ...]] | None = None  # (pid, torchvision's order)
        self._parse(_read_json(self.ann_file))

    def _parse(self, data: dict[str, Any]) -> None:
        ann_file = self.ann_file
        file_of: dict[int, str] = {}
        size_of: dict[int, tuple[int, int]] = {}
        for j, img in enumerate(data.get("images", [])):
            if not isinstance(img, dict):
                raise ValueError(f"{ann_file}: `images[{j}]` must be an object. "
                                 f"Found: {type(img).__name__}.")
            image_id, name = img.get("id"), img.get("file_name")
            if not isinstance(image_id, int) or isinstance(image_id, bool):
                raise ValueError(f"{ann_file}: `images[{j}].id` must be an integer. "
                                 f"Found: {image_id!r}.")
            if not isinstance(name, str):
                raise ValueError(f"{ann_file}: `images[{j}].file_name` must be a string. "
                                 f"Found: {name!r}.")
            file_of[image_id] = name  # a repeated id: the last entry, as pycocotools
            size_of[image_id] = _stated_size(img)
        ids = sorted(file_of)
        position = {image_id: k for k, image_id in enumerate(ids)}
        parser = _Parser(ann_file)
        owner: list[int] = []
        for j, ann in enumerate(data.get("annotations", [])):
            image_id = ann.get("image_id") if isinstance(ann, dict) else None
            if image_id not in position:
                continue  # an annotation of no listed image: never returned
            owner.append(position[image_id])
            parser.annotation(j, ann)
        order = np.argsort(np.asarray(owner, dtype=np.int64), kind="stable")
        counts = np.bincount(np.asarray(owner, dtype=np.int64), minlength=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])

        def flat(values: Any, dtype: Any, shape: tuple[int, ...] = (-1,)) -> Any:
            arr = np.asarray(values, dtype=dtype).reshape(shape)
            return share(arr[order] if len(order) else arr)

        self._ids = share(np.asarray(ids, dtype=np.int64))
        self._paths = PathTable(os.path.join(self.root, file_of[k]) for k in ids)
        self._sizes = share(np.asarray([size_of[k] for k in ids], dtype=np.int64).reshape(-1, 2))
        self._offsets = share(offsets)
        self._bbox = flat(parser.bbox, np.float64, (-1, 4))
        self._bbox_int = flat(parser.bbox_int, np.bool_)
        self._category = flat(parser.category, np.int64)
        self._iscrowd = flat(parser.iscrowd, np.int64)
        self._area = flat(parser.area, np.float64)
        self._area_int = flat(parser.area_int, np.bool_)
        self._missing = flat(parser.missing, np.uint8)
        self._kind = flat(parser.kind, np.uint8)
        self._seg_lo = flat(parser.seg_lo, np.int64)
        self._seg_hi = flat(parser.seg_hi, np.int64)
        self._seg_size = flat(parser.seg_size, np.int64, (-1, 2))
        self._coords = share(_compact_coords(np.asarray(parser.coords, dtype=np.float64)))
        self._poly_off = share(np.concatenate(([0], np.asarray(parser.poly_ends, np.int64))))
        self._rle_blob = share(np.frombuffer(bytes(parser.rle_blob), dtype=np.uint8))

    # -- the DetectionSource protocol ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> list[int]:
        """Image ids in sample order (torchvision's ``ids``: sorted)."""
        return self._ids.tolist()

    def describe(self, index: int) -> str:
        return self._paths[index]

    def get_height_and_width(self, index: int) -> tuple[int, int]:
        """(height, width) in pixels of sample ``index``'s image, from the annotation file's
        ``images`` entry (read from the file's header where the entry has none), without
        decoding it: what torchvision's detection references ask a dataset for to group images
        by aspect ratio (``GroupedBatchSampler``). As stored: EXIF orientation is ignored, as
        the samples ignore it."""
        h, w = (int(v) for v in self._sizes[index])
        if h > 0:
            return h, w
        with open(self._paths[index], "rb") as f:
            try:
                header = read_header(f.read())
            except DecodeError as exc:
                raise DecodeError(f"cannot read the size of {self._paths[index]} (sample index "
                                  f"{index}; its `images` entry has no height and width): {exc}") from exc
        return header.encoded_height, header.encoded_width

    @property
    def coco(self) -> Any:
        """The annotation file as a ``pycocotools.coco.COCO`` (torchvision's ``CocoDetection.coco``:
        ``getAnnIds``, ``loadAnns``, ``imgs``...), loaded at first use in each process and never
        sent to workers (the samples come from gpufeed's own parse). Needs pycocotools."""
        loaded = self.__dict__.get("_coco")
        if loaded is None:
            try:
                from pycocotools.coco import COCO
            except ImportError as exc:
                raise ImportError(f"CocoDetection.coco is a pycocotools COCO object, and pycocotools "
                                  f"is not installed ({exc}). Install it: pip install pycocotools "
                                  "(gpufeed's masks need it too).") from exc
            loaded = COCO(self.ann_file)
            self.__dict__["_coco"] = loaded
        return loaded

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_coco", None)  # loaded again where it is used (it holds the whole file)
        return state

    def record(self, index: int) -> tuple[int, int]:
        """The annotation range of sample ``index`` (what :meth:`target_of` takes)."""
        return int(self._offsets[index]), int(self._offsets[index + 1])

    def read_item(self, index: int) -> tuple[Buffer, tuple[int, int]]:
        with open(self._paths[index], "rb") as f:
            return f.read(), self.record(index)

    def target_of(self, index: int, record: Any, canvas: tuple[int, int]) -> dict[str, Any]:
        """The target dict of sample ``index`` (annotations ``record`` = (start, stop)) on an
        image of ``canvas`` = (H, W): ``Boxes``, a lazy ``Mask`` and tensors of labels."""
        lo, hi = record
        image_id = int(self._ids[index])
        if hi <= lo:
            return {"image_id": image_id}
        canvas = (int(canvas[0]), int(canvas[1]))
        keys = self.target_keys
        target: dict[str, Any] = {}
        if "image_id" in keys:
            target["image_id"] = image_id
        if "boxes" in keys:
            target["boxes"] = self._boxes(lo, hi, canvas)
        if "masks" in keys:
            self._check_present(index, lo, hi, "segmentation")
            rles = [self._rle(a, canvas) for a in range(lo, hi)]
            target["masks"] = Mask(lazy=CocoPlanes(rles, canvas))
        if "labels" in keys:
            target["labels"] = torch.from_numpy(np.array(self._category[lo:hi], dtype=np.int64))
        for key in self._key_order():
            target[key] = self._raw(index, key, lo, hi)
        return target

    def _key_order(self) -> tuple[str, ...]:
        """The raw keys in the order the wrapped torchvision dataset gives them in this process
        (the iteration order of its set of keys, which depends on the process's string hashes),
        where torchvision is imported; a fixed order otherwise."""
        if len(self._extra_keys) < 2 or "torchvision" not in sys.modules:
            return self._extra_keys
        if self._extra_order is None or self._extra_order[0] != os.getpid():
            self._extra_order = (os.getpid(), _torchvision_key_order(self._target_keys_arg)
                                 or self._extra_keys)
        return self._extra_order[1]

    # -- pieces of a target -------------------------------------------------------------------

    def _boxes(self, lo: int, hi: int, canvas: tuple[int, int]) -> Boxes:
        """XYWH -> XYXY in the dtype torchvision infers from the JSON numbers (int64 when all
        are integers, else float32, added in float32 as ``convert_bounding_box_format``)."""
        if bool(self._bbox_int[lo:hi].all()):
            xywh: np.ndarray = np.array(self._bbox[lo:hi], dtype=np.int64)
            dtype = "int64"
        else:
            xywh = np.array(self._bbox[lo:hi], dtype=np.float32)
            dtype = "float32"
        xywh[:, 2:] += xywh[:, :2]
        return Boxes(xywh.astype(np.float64), "XYXY", canvas, dtype=dtype)

    def _check_present(self, index: int, lo: int, hi: int, key: str) -> None:
        bad = np.flatnonzero(self._missing[lo:hi] & _MISSING_BITS[key])
        if len(bad):
            raise ValueError(f"{self.ann_file}: an annotation of image id {int(self._ids[index])} "
                             f"({self.describe(index)}) has no `{key}`, which `target_keys` asks "
                             f"for.")

    def _rle(self, a: int, canvas: tuple[int, int]) -> dict[str, Any]:
        """Annotation ``a``'s compressed RLE on ``canvas`` (torchvision's wrapper's rules)."""
        if int(self._kind[a]) & ~SIZE_FIRST == RLE_LIST:  # stored compressed: as frPyObjects
            lo, hi = int(self._seg_lo[a]), int(self._seg_hi[a])
            return {"size": [int(v) for v in self._seg_size[a]],
                    "counts": self._rle_blob[lo:hi].tobytes()}
        return segmentation_rle(self._segmentation(a), canvas)

    def _segmentation(self, a: int) -> Any:
        """Annotation ``a``'s segmentation as the JSON gave it."""
        kind, lo, hi = int(self._kind[a]), int(self._seg_lo[a]), int(self._seg_hi[a])
        size_first, kind = bool(kind & SIZE_FIRST), kind & ~SIZE_FIRST
        if kind == POLYGONS:
            off = self._poly_off
            coords = self._coords
            scale = 1.0 if coords.dtype == np.float64 else 100.0
            return [(coords[off[p]:off[p + 1]] / scale).tolist() for p in range(lo, hi)]
        size = [int(v) for v in self._seg_size[a]]
        if kind not in (RLE_LIST, RLE_STRING):
            return None
        counts: Any = self._rle_blob[lo:hi].tobytes()
        counts = rle_counts(counts).tolist() if kind == RLE_LIST else counts.decode("ascii")
        return {"size": size, "counts": counts} if size_first else {"counts": counts, "size": size}

    def _raw(self, index: int, key: str, lo: int, hi: int) -> list[Any]:
        """One of COCO's own keys, a list over the image's annotations."""
        if key in _MISSING_BITS:
            self._check_present(index, lo, hi, key)
        if key == "segmentation":
            return [self._segmentation(a) for a in range(lo, hi)]
        if key == "area":
            return [int(v) if is_int else float(v)
                    for v, is_int in zip(self._area[lo:hi], self._area_int[lo:hi])]
        if key == "bbox":
            return [[int(v) for v in box] if is_int else box.tolist()
                    for box, is_int in zip(self._bbox[lo:hi], self._bbox_int[lo:hi])]
        if key == "iscrowd":
            return self._iscrowd[lo:hi].tolist()
        if key == "category_id":
            return self._category[lo:hi].tolist()
        raise KeyError(key)

    # -- torch Dataset ------------------------------------------------------------------------

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """(image, target) of sample ``index``: see the class docstring."""
        return source_item(self, index, self._plain_item)

    def _plain_item(self, i: int) -> tuple[Any, Any]:
        image = open_pil(self._paths[i])
        return image, to_torchvision(self.target_of(i, self.record(i), (image.height, image.width)))

    @property
    def nbytes(self) -> int:
        """Memory held by the annotation tables, in bytes."""
        arrays = [self._ids, self._offsets, self._bbox, self._bbox_int, self._category,
                  self._iscrowd, self._area, self._area_int, self._missing, self._kind,
                  self._seg_lo, self._seg_hi, self._seg_size, self._coords, self._poly_off,
                  self._rle_blob]
        return int(sum(a.nbytes for a in arrays)) + self._paths.nbytes

    def __repr__(self) -> str:
        return (f"CocoDetection({len(self)} images, {len(self._category)} annotations, "
                f"root={self.root!r}, annFile={self.ann_file!r})")
