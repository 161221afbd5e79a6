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
import os
import sys
from typing import Any

import numpy as np
import torch

from gpufeed.decoders import read_header
from gpufeed.decoders._header import Buffer
from gpufeed.errors import SKIP_HINT, DecodeError
from gpufeed.image.detection._sample import Boxes, Mask
from gpufeed.sources._coco_cache import cached_tables
from gpufeed.sources._coco_masks import CocoPlanes, check_rle, rle_counts, segmentation_rle
from gpufeed.sources._coco_parse import (
    MISSING_BITS,
    POLYGONS,
    RLE_LIST,
    RLE_STRING,
    SIZE_FIRST,
    CocoTables,
    gc_paused,
    parse_annotations,
    read_json,
)
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

    ``index_cache``: a file path where the parsed annotation tables are kept between runs (a
    plain ``.npz``, not a pickle), used while the annotation file's bytes are unchanged (its
    SHA-1), rewritten otherwise: a train2017-sized file then builds in about 2 s instead of
    about 23 (``gpufeed.sources._coco_cache``).
    """

    def __init__(self, root: str | os.PathLike, annFile: str | os.PathLike,  # noqa: N803 - torchvision's name
                 transform: Any = None, target_transform: Any = None, transforms: Any = None,
                 target_keys: Any = None, *, read_concurrency: int | None = None,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES,
                 index_cache: str | os.PathLike | None = None) -> None:
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
        self.index_cache = None if index_cache is None else os.fspath(index_cache)

        def parse() -> CocoTables:
            with gc_paused():
                return parse_annotations(self.ann_file, read_json(self.ann_file))

        self._parse(cached_tables(self.index_cache, self.ann_file, parse))

    def _parse(self, t: CocoTables) -> None:
        self._ids = share(t.ids)
        self._paths = PathTable(os.path.join(self.root, name) for name in t.files)
        self._sizes = share(t.sizes)
        self._offsets = share(t.offsets)
        self._bbox, self._bbox_int = share(t.bbox), share(t.bbox_int)
        self._category, self._iscrowd = share(t.category), share(t.iscrowd)
        self._area, self._area_int = share(t.area), share(t.area_int)
        self._missing, self._kind = share(t.missing), share(t.kind)
        self._seg_lo, self._seg_hi, self._seg_size = share(t.seg_lo), share(t.seg_hi), share(t.seg_size)
        self._coords, self._poly_off = share(t.coords), share(t.poly_off)
        self._rle_blob = share(t.rle_blob)

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
            target["masks"] = Mask(lazy=self._planes(index, lo, hi, canvas))
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
        bad = np.flatnonzero(self._missing[lo:hi] & MISSING_BITS[key])
        if len(bad):
            raise ValueError(f"{self.ann_file}: an annotation of image id {int(self._ids[index])} "
                             f"({self.describe(index)}) has no `{key}`, which `target_keys` asks "
                             f"for.")

    def _planes(self, index: int, lo: int, hi: int, canvas: tuple[int, int]) -> CocoPlanes:
        """The masks of sample ``index``'s annotations ``lo:hi``; a segmentation pycocotools
        cannot rasterise faithfully raises a DecodeError naming it (``on_error="skip"`` leaves
        the sample out)."""
        a = lo
        try:
            rles = []
            for a in range(lo, hi):
                rles.append(self._rle(a, canvas))
            return CocoPlanes(rles, canvas)
        except DecodeError as exc:
            raise DecodeError(
                f"{self.ann_file}: the segmentation of image id {int(self._ids[index])}'s annotation "
                f"{a - lo} (0-based, in the file's order; {self.describe(index)}), sample index "
                f"{index}: {exc}. "
                f"Fix or remove that annotation, leave 'masks' out of `target_keys`, or pass "
                f"{SKIP_HINT} to leave such samples out of their batch.") from None

    def _rle(self, a: int, canvas: tuple[int, int]) -> dict[str, Any]:
        """Annotation ``a``'s compressed RLE on ``canvas`` (torchvision's wrapper's rules)."""
        if int(self._kind[a]) & ~SIZE_FIRST == RLE_LIST:  # stored compressed: as frPyObjects
            lo, hi = int(self._seg_lo[a]), int(self._seg_hi[a])
            size, counts = [int(v) for v in self._seg_size[a]], self._rle_blob[lo:hi].tobytes()
            check_rle(counts, size)
            return {"size": size, "counts": counts}
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
        if key in MISSING_BITS:
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
