"""The COCO annotation file, parsed once into flat numpy arrays (``parse_annotations``).

One pass over the JSON's ``annotations`` checks each entry's types and appends its fields to flat
lists; the arrays are sorted by image at the end. The checks are what a user's file gets wrong
(a missing ``bbox``, a string where a number goes), and every error names the entry, the key and
the value found.

Speed and memory (``benchmarks/coco_parse.py``, ``benchmarks/results/coco-parse.md``):

- the polygon coordinates (tens of millions in a file of train2017's size) are type-checked in
  bulk, by the dtype numpy infers for each chunk of them (numbers give a numeric dtype; a
  string, null, list or object does not); only a chunk that fails is walked value by value, to
  name the entry. The per-value check took 16 of the pass's 18 s on a 372 MB file;
- the cyclic garbage collector is paused while the JSON is read and parsed (``gc_paused``): the
  millions of containers ``json.load`` makes set off full collections that free nothing (13.4
  -> 9.0 s for that file's ``json.load``); reference counting still frees the JSON;
- the file is read as text (bytes would be held with their decoded str), and the JSON's entries
  are dropped every :data:`CHUNK` annotations, once parsed, so the peak stays near the JSON's.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.sources._coco_masks import rle_string

__all__ = ["MISSING_BITS", "NO_SEGMENTATION", "POLYGONS", "RLE_LIST", "RLE_STRING", "SIZE_FIRST",
           "CocoTables", "compact_coords", "gc_paused", "parse_annotations", "read_json"]

# Segmentation kinds: a list of polygons, an RLE with list counts, an RLE with string counts.
POLYGONS, RLE_LIST, RLE_STRING, NO_SEGMENTATION = 0, 1, 2, 3
SIZE_FIRST = 0x10  # flag on an RLE's kind: its JSON object lists `size` before `counts`
# Bits of `missing`: the annotation lacks this optional key.
MISSING_BITS = {"area": 1, "iscrowd": 2, "segmentation": 4}

_NUMBER = (int, float)  # JSON numbers, by exact type: a JSON true/false is a bool, not one
_NUMERIC_KINDS = "biuf"  # numpy dtype kinds of an array of JSON numbers (and booleans)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector disabled inside the block, as it was after (reference
    counting still frees everything a block drops)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_json(ann_file: str) -> dict[str, Any]:
    """The annotation file's JSON object, its ``images`` and ``annotations`` checked to be lists."""
    # text, not bytes: json.load of bytes holds them and their decoded str at once (a peak of
    # the file's size more); "utf-8-sig" takes a file with or without a byte order mark
    with open(ann_file, encoding="utf-8-sig") as f:
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


def compact_coords(coords: np.ndarray) -> np.ndarray:
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
    if type(h) is int and type(w) is int and h > 0 and w > 0:
        return h, w
    return -1, -1


def _is_box(bbox: Any) -> bool:
    return (type(bbox) is list and len(bbox) == 4 and type(bbox[0]) in _NUMBER
            and type(bbox[1]) in _NUMBER and type(bbox[2]) in _NUMBER and type(bbox[3]) in _NUMBER)


#: (field, dtype, shape) of the per-annotation columns, each flushed to an array per chunk
_COLUMNS = (("bbox", np.float64, (-1, 4)), ("bbox_int", np.bool_, (-1,)), ("category", np.int64, (-1,)),
            ("iscrowd", np.int64, (-1,)), ("area", np.float64, (-1,)), ("area_int", np.bool_, (-1,)),
            ("missing", np.uint8, (-1,)), ("kind", np.uint8, (-1,)), ("seg_lo", np.int64, (-1,)),
            ("seg_hi", np.int64, (-1,)), ("seg_size", np.int64, (-1, 2)))

#: annotations parsed between flushes: their Python objects are freed at each flush
CHUNK = 1 << 16


class _Parser:
    """One pass over the annotation JSON into flat lists, flushed to arrays every :data:`CHUNK`
    annotations (:meth:`flush`) so that the JSON's objects can be freed as the pass goes."""

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
        # polygons since the last flush: their coordinates (checked by `flush`), where each ends
        # in them, and the annotation (index in the JSON) each belongs to
        self.coords: list[Any] = []
        self.poly_ends: list[int] = []
        self.poly_entry: list[int] = []
        self.coords_before = 0  # coordinates flushed
        self.polys_before = 0  # polygons flushed
        self.rle_blob = bytearray()
        self.arrays: dict[str, list[np.ndarray]] = {name: [] for name in
                                                    (*(c[0] for c in _COLUMNS), "coords", "poly_ends")}

    def fail(self, where: str, what: str) -> ValueError:
        return ValueError(f"{self.ann_file}: `{where}` {what}")

    def annotation(self, j: int, ann: Any) -> None:
        if not isinstance(ann, dict):
            raise self.fail(f"annotations[{j}]", f"must be an object. Found: {type(ann).__name__}.")
        bbox: Any = ann.get("bbox")
        if not _is_box(bbox):
            raise self.fail(f"annotations[{j}].bbox", f"must be 4 numbers [x, y, w, h]. Found: {bbox!r}.")
        self.bbox.append(bbox)
        self.bbox_int.append(type(bbox[0]) is int and type(bbox[1]) is int and type(bbox[2]) is int
                             and type(bbox[3]) is int)
        cat = ann.get("category_id")
        if type(cat) is not int:
            raise self.fail(f"annotations[{j}].category_id", f"must be an integer. Found: {cat!r}.")
        self.category.append(cat)
        missing = 0
        crowd = ann.get("iscrowd")
        if crowd is None:
            missing |= MISSING_BITS["iscrowd"]
        elif not isinstance(crowd, int):
            raise self.fail(f"annotations[{j}].iscrowd", f"must be 0 or 1. Found: {crowd!r}.")
        self.iscrowd.append(int(crowd or 0))
        area = ann.get("area")
        if area is None:
            missing |= MISSING_BITS["area"]
        elif not isinstance(area, _NUMBER):
            raise self.fail(f"annotations[{j}].area", f"must be a number. Found: {area!r}.")
        self.area.append(float(area or 0.0))
        self.area_int.append(isinstance(area, int))
        seg = ann.get("segmentation")
        if seg is None:
            missing |= MISSING_BITS["segmentation"]
        self.missing.append(missing)
        if type(seg) is list:  # polygons: the common case, inline
            lo = self.polys_before + len(self.poly_ends)
            for poly in seg:
                if type(poly) is not list:
                    raise self._not_segmentation(j, seg)
                self.coords.extend(poly)
                self.poly_ends.append(len(self.coords))
                self.poly_entry.append(j)
            self.kind.append(POLYGONS)
            self.seg_lo.append(lo)
            self.seg_hi.append(self.polys_before + len(self.poly_ends))
            self.seg_size.append((0, 0))
        else:
            self.segmentation(j, seg)

    def _not_segmentation(self, j: int, seg: Any) -> ValueError:
        return self.fail(f"annotations[{j}].segmentation", f"must be a list of polygons [x0, y0, x1, "
                                                           f"y1, ...] or an RLE object. Found: {str(seg)[:80]}.")

    def segmentation(self, j: int, seg: Any) -> None:
        """An RLE segmentation, or none."""
        where = f"annotations[{j}].segmentation"
        size, size_first = (0, 0), False
        if seg is None:
            kind, lo, hi = NO_SEGMENTATION, 0, 0
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
        self.kind.append(kind | (SIZE_FIRST if size_first else 0))
        self.seg_lo.append(lo)
        self.seg_hi.append(hi)
        self.seg_size.append(size)

    def _coordinates(self, annotations: list[Any]) -> np.ndarray:
        """The coordinates since the last flush, float64, checked to be numbers (``annotations``:
        the JSON's list, to quote the entry that holds one that is not)."""
        try:
            arr = np.array(self.coords) if self.coords else np.zeros(0)
            if arr.ndim == 1 and arr.dtype.kind in _NUMERIC_KINDS:
                return arr.astype(np.float64, copy=False)
        except (ValueError, TypeError):  # lists among the numbers: numpy refuses the ragged shape
            pass
        start = 0  # something numpy kept as objects or strings: find it, or convert what it was
        for p, end in enumerate(self.poly_ends):
            if not all(isinstance(v, _NUMBER) for v in self.coords[start:end]):
                j = self.poly_entry[p]
                raise self._not_segmentation(j, annotations[j].get("segmentation"))
            start = end
        return np.asarray(self.coords, dtype=np.float64)  # e.g. integers past 64 bits

    def flush(self, annotations: list[Any]) -> None:
        """The lists since the last flush to arrays (the coordinates checked), then emptied."""
        coords = self._coordinates(annotations)
        self.arrays["coords"].append(coords)
        self.arrays["poly_ends"].append(np.asarray(self.poly_ends, np.int64) + self.coords_before)
        self.coords_before += len(coords)
        self.polys_before += len(self.poly_ends)
        for name in ("coords", "poly_ends", "poly_entry"):
            getattr(self, name).clear()
        for name, dtype, shape in _COLUMNS:
            values = getattr(self, name)
            self.arrays[name].append(np.asarray(values, dtype=dtype).reshape(shape))
            values.clear()

    def column(self, name: str) -> np.ndarray:
        """All of a flushed column, one array."""
        parts = self.arrays[name]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass(frozen=True)
class CocoTables:
    """The annotation file as arrays: images in sorted id order (``ids``, ``files``, ``sizes``
    (height, width), -1 where not stated), their annotations contiguous (``offsets``: image k's
    are rows ``offsets[k]:offsets[k + 1]`` of every per-annotation array)."""

    ids: np.ndarray
    files: list[str]
    sizes: np.ndarray
    offsets: np.ndarray
    bbox: np.ndarray
    bbox_int: np.ndarray
    category: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    area_int: np.ndarray
    missing: np.ndarray
    kind: np.ndarray
    seg_lo: np.ndarray
    seg_hi: np.ndarray
    seg_size: np.ndarray
    coords: np.ndarray  # every polygon's coordinates (``compact_coords``)
    poly_off: np.ndarray  # polygon p is coords[poly_off[p]:poly_off[p + 1]]
    rle_blob: np.ndarray


def _images(ann_file: str, data: dict[str, Any]) -> tuple[dict[int, str], dict[int, tuple[int, int]]]:
    file_of: dict[int, str] = {}
    size_of: dict[int, tuple[int, int]] = {}
    for j, img in enumerate(data.get("images", [])):
        if not isinstance(img, dict):
            raise ValueError(f"{ann_file}: `images[{j}]` must be an object. "
                             f"Found: {type(img).__name__}.")
        image_id, name = img.get("id"), img.get("file_name")
        if type(image_id) is not int:
            raise ValueError(f"{ann_file}: `images[{j}].id` must be an integer. "
                             f"Found: {image_id!r}.")
        if not isinstance(name, str):
            raise ValueError(f"{ann_file}: `images[{j}].file_name` must be a string. "
                             f"Found: {name!r}.")
        file_of[image_id] = name  # a repeated id: the last entry, as pycocotools
        size_of[image_id] = _stated_size(img)
    return file_of, size_of


def parse_annotations(ann_file: str, data: dict[str, Any]) -> CocoTables:
    """``data`` (the file's JSON, :func:`read_json`) as :class:`CocoTables`; annotations of an
    image the file does not list are left out (they are never returned). Consumes
    ``data["annotations"]``: each chunk of its entries is dropped once parsed, so that the JSON
    is freed while the arrays grow (the peak stays near the JSON's own)."""
    file_of, size_of = _images(ann_file, data)
    ids = sorted(file_of)
    position = {image_id: k for k, image_id in enumerate(ids)}
    parser = _Parser(ann_file)
    owner: list[int] = []
    annotations = data.get("annotations", [])
    for start in range(0, len(annotations), CHUNK):
        stop = min(start + CHUNK, len(annotations))
        for j in range(start, stop):
            ann: Any = annotations[j]
            image_id: Any = ann.get("image_id") if isinstance(ann, dict) else None
            k = position.get(image_id)
            if k is None:
                continue
            owner.append(k)
            parser.annotation(j, ann)
        parser.flush(annotations)
        annotations[start:stop] = [None] * (stop - start)
    if not annotations:
        parser.flush(annotations)
    owners = np.asarray(owner, dtype=np.int64)
    order = np.argsort(owners, kind="stable")
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owners, minlength=len(ids)), out=offsets[1:])

    def flat(name: str) -> np.ndarray:
        arr = parser.column(name)
        return arr[order] if len(order) else arr

    return CocoTables(
        ids=np.asarray(ids, dtype=np.int64), files=[file_of[k] for k in ids],
        sizes=np.asarray([size_of[k] for k in ids], dtype=np.int64).reshape(-1, 2), offsets=offsets,
        bbox=flat("bbox"), bbox_int=flat("bbox_int"), category=flat("category"),
        iscrowd=flat("iscrowd"), area=flat("area"), area_int=flat("area_int"),
        missing=flat("missing"), kind=flat("kind"), seg_lo=flat("seg_lo"), seg_hi=flat("seg_hi"),
        seg_size=flat("seg_size"), coords=compact_coords(parser.column("coords")),
        poly_off=np.concatenate(([0], parser.column("poly_ends"))),
        rle_blob=np.frombuffer(bytes(parser.rle_blob), dtype=np.uint8))
