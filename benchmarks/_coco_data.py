"""Synthetic detection and segmentation data for the benchmarks (``detection.py``,
``detection_ops.py``), deterministic from a seed:

- :func:`make_coco`: photo-like JPEGs (``gpufeed.synth.photo_like``) of 480-640 px a side and a
  COCO instances JSON: 2-8 objects per image, each with ``bbox`` (XYWH, the tight box of its
  polygons), ``category_id`` (:data:`CATEGORIES`), ``area`` (the polygons' area), ``iscrowd`` 0
  and a polygon ``segmentation`` (one or two polygons inside the object's box), drawn into the
  image so that objects look like objects;
- :func:`make_segmentation_pairs`: JPEG + palette PNG mask pairs as in Pascal VOC (class
  indices 0-20, 255 on a 3 px border around each object), ``images/`` and ``masks/``.

Without pycocotools and torchvision: the files are written with OpenCV and Pillow.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.synth import encode, photo_like

#: (id, name): COCO ids need not be contiguous (as in COCO itself)
CATEGORIES = ((1, "person"), (3, "car"), (17, "cat"), (18, "dog"), (44, "bottle"))
SIZE = (480, 640)  # each side drawn in this range, px
VOC_CLASSES = 21  # 0 background, 1-20 objects; 255 "void" borders
QUALITY = 90


@dataclass(frozen=True)
class CocoData:
    """What :func:`make_coco` wrote: the image folder, the annotation file, images and objects."""

    root: Path
    ann_file: Path
    num_images: int
    num_objects: int


@dataclass(frozen=True)
class SegmentationData:
    """What :func:`make_segmentation_pairs` wrote: image and mask paths, in the same order."""

    images: tuple[str, ...]
    masks: tuple[str, ...]


def _polygon(rng: np.random.Generator, x0: float, y0: float, w: float, h: float) -> np.ndarray:
    """A star-shaped polygon (K, 2) float inside the box (x0, y0, w, h): 5-12 vertices at sorted
    angles around the centre, each at 50-100% of the half-size."""
    k = int(rng.integers(5, 13))
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radius = rng.uniform(0.5, 1.0, k)
    cx, cy = x0 + w / 2, y0 + h / 2
    pts = np.stack([cx + np.cos(angles) * radius * w / 2, cy + np.sin(angles) * radius * h / 2], axis=1)
    return np.round(pts, 2)


def _area(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return float(abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) / 2)


def _objects(rng: np.random.Generator, height: int, width: int) -> list[list[np.ndarray]]:
    """2-8 objects, each one or two polygons (the second smaller, in another part of the box)."""
    out = []
    for _ in range(int(rng.integers(2, 9))):
        w = float(rng.uniform(0.08, 0.6) * width)
        h = float(rng.uniform(0.08, 0.6) * height)
        x0, y0 = float(rng.uniform(0, width - w)), float(rng.uniform(0, height - h))
        if rng.random() < 0.3:  # two parts: the box's left and right halves
            polys = [_polygon(rng, x0, y0, w * 0.55, h), _polygon(rng, x0 + w * 0.6, y0 + h * 0.2, w * 0.4, h * 0.6)]
        else:
            polys = [_polygon(rng, x0, y0, w, h)]
        out.append(polys)
    return out


def _size(rng: np.random.Generator, size: tuple[int, int]) -> tuple[int, int]:
    return int(rng.integers(size[0], size[1] + 1)), int(rng.integers(size[0], size[1] + 1))


def make_coco(out: str | Path, num_images: int, *, seed: int = 0,
              size: tuple[int, int] = SIZE) -> CocoData:
    """``num_images`` JPEGs in ``out/images`` and ``out/instances.json`` (module docstring);
    each side of an image is drawn in ``size`` (px, inclusive)."""
    import cv2

    if num_images < 1:
        raise ValueError(f"`num_images` must be >= 1. Found: {num_images}.")
    out = Path(out)
    root = out / "images"
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i in range(num_images):
        height, width = _size(rng, size)
        img = photo_like(height, width, seed=rng)
        name = f"{i:012d}.jpg"
        for polys in _objects(rng, height, width):
            category = CATEGORIES[int(rng.integers(0, len(CATEGORIES)))][0]
            color = tuple(int(c) for c in rng.integers(0, 256, 3))
            cv2.fillPoly(img, [np.round(p).astype(np.int32) for p in polys], color, cv2.LINE_AA)
            pts = np.concatenate(polys)
            x0, y0 = pts.min(axis=0)
            x1, y1 = pts.max(axis=0)
            annotations.append({
                "id": len(annotations) + 1, "image_id": i + 1, "category_id": category,
                "bbox": [round(float(x0), 2), round(float(y0), 2), round(float(x1 - x0), 2), round(float(y1 - y0), 2)],
                "area": round(sum(_area(p) for p in polys), 2), "iscrowd": 0,
                "segmentation": [[float(v) for v in p.reshape(-1)] for p in polys]})
        (root / name).write_bytes(encode(img, quality=QUALITY))
        images.append({"id": i + 1, "file_name": name, "height": height, "width": width})
    ann_file = out / "instances.json"
    ann_file.write_text(json.dumps({
        "images": images, "annotations": annotations,
        "categories": [{"id": c, "name": n, "supercategory": n} for c, n in CATEGORIES]}))
    return CocoData(root, ann_file, num_images, len(annotations))


def make_segmentation_pairs(out: str | Path, num_images: int, *, seed: int = 0,
                            size: tuple[int, int] = SIZE) -> SegmentationData:
    """``num_images`` pairs: ``out/images/%06d.jpg`` and ``out/masks/%06d.png``, a palette
    ("P") PNG of class indices as Pascal VOC's (module docstring)."""
    import cv2
    from PIL import Image

    if num_images < 1:
        raise ValueError(f"`num_images` must be >= 1. Found: {num_images}.")
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "masks").mkdir(parents=True, exist_ok=True)
    palette = np.random.default_rng(12345).integers(0, 256, (256, 3), dtype=np.uint8)
    palette[0], palette[255] = 0, 224
    rng = np.random.default_rng(seed)
    images, masks = [], []
    for i in range(num_images):
        height, width = _size(rng, size)
        img = photo_like(height, width, seed=rng)
        mask = np.zeros((height, width), np.uint8)
        for polys in _objects(rng, height, width):
            label = int(rng.integers(1, VOC_CLASSES))
            color = tuple(int(c) for c in rng.integers(0, 256, 3))
            pts = [np.round(p).astype(np.int32) for p in polys]
            cv2.fillPoly(img, pts, color, cv2.LINE_AA)
            cv2.polylines(mask, pts, True, 255, 3)
            cv2.fillPoly(mask, pts, label)
        image_path, mask_path = out / "images" / f"{i:06d}.jpg", out / "masks" / f"{i:06d}.png"
        image_path.write_bytes(encode(img, quality=QUALITY))
        png = Image.fromarray(mask, mode="P")
        png.putpalette(palette.reshape(-1).tolist())
        png.save(mask_path)
        images.append(str(image_path))
        masks.append(str(mask_path))
    return SegmentationData(tuple(images), tuple(masks))


def prepare(out: str | Path, num_images: int, *, seed: int = 0) -> tuple[CocoData, SegmentationData]:
    """Both data sets under ``out`` (``coco/`` and ``seg/``), written once: reused while
    ``out/done`` records the same count and seed."""
    out = Path(out)
    stamp, key = out / "done", f"{num_images} images, seed {seed}"
    if stamp.exists() and stamp.read_text() == key:
        coco = json.loads((out / "coco" / "instances.json").read_text())
        seg = sorted((out / "seg" / "images").glob("*.jpg"))
        return (CocoData(out / "coco" / "images", out / "coco" / "instances.json", num_images,
                         len(coco["annotations"])),
                SegmentationData(tuple(map(str, seg)),
                                 tuple(str(out / "seg" / "masks" / f"{p.stem}.png") for p in seg)))
    stamp.unlink(missing_ok=True)
    for sub in ("coco", "seg"):  # a run with another count leaves no stale files behind
        shutil.rmtree(out / sub, ignore_errors=True)
    coco_data = make_coco(out / "coco", num_images, seed=seed)
    seg_data = make_segmentation_pairs(out / "seg", num_images, seed=seed + 1)
    stamp.write_text(key)
    return coco_data, seg_data
