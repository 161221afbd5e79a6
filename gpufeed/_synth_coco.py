"""Synthetic detection and segmentation datasets for tests and benchmarks: a COCO-style folder
(photo-like JPEGs of varied sizes and an instances JSON with boxes, polygons and RLEs) and
image + palette-PNG mask pairs (VOC style). Deterministic from a seed."""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.synth import encode, photo_like

__all__ = ["SynthCoco", "SynthSegmentation", "make_coco", "make_segmentation", "voc_palette"]


@dataclass(frozen=True)
class SynthCoco:
    """What :func:`make_coco` wrote: the image folder, the annotation file and counts."""

    root: Path
    ann_file: Path
    num_images: int
    num_annotations: int


@dataclass(frozen=True)
class SynthSegmentation:
    """What :func:`make_segmentation` wrote: image and mask folders and the pairs' paths."""

    images: Path
    masks: Path
    image_paths: tuple[Path, ...]
    mask_paths: tuple[Path, ...]


def _polygon(rng: np.random.Generator, box: tuple[float, float, float, float]) -> list[float]:
    """A random star-shaped polygon inside ``box`` (x, y, w, h): [x0, y0, x1, y1, ...]."""
    x, y, w, h = box
    n = int(rng.integers(3, 9))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radius = rng.uniform(0.3, 1.0, n)
    cx, cy = x + w * rng.uniform(0.3, 0.7), y + h * rng.uniform(0.3, 0.7)
    px = np.clip(cx + np.cos(angles) * radius * w / 2, x, x + w)
    py = np.clip(cy + np.sin(angles) * radius * h / 2, y, y + h)
    return [round(float(v), 2) for v in np.stack([px, py], 1).reshape(-1)]


def _ellipse_mask(rng: np.random.Generator, box: tuple[float, float, float, float],
                  size: tuple[int, int]) -> np.ndarray:
    import cv2

    x, y, w, h = box
    mask = np.zeros(size, dtype=np.uint8)
    center = (int(x + w / 2), int(y + h / 2))
    axes = (max(1, int(w / 2)), max(1, int(h / 2)))
    cv2.ellipse(mask, center, axes, float(rng.uniform(0, 180)), 0, 360, 1, -1)
    return mask


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE of a 0/1 mask: column-major run lengths starting with zeros."""
    flat = mask.reshape(-1, order="F")
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate(([0], change, [flat.size]))
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        counts = [0] + counts
    return {"counts": counts, "size": [int(mask.shape[0]), int(mask.shape[1])]}


def make_coco(root: str | os.PathLike, n_images: int, *,
              size: tuple[tuple[int, int], tuple[int, int]] = ((160, 360), (200, 480)),
              num_categories: int = 6, max_objects: int = 6, crowd_fraction: float = 0.1,
              string_rle_fraction: float = 0.05, empty_fraction: float = 0.1,
              int_box_fraction: float = 0.1, seed: int = 0, quality: int = 90) -> SynthCoco:
    """Write ``root/images/*.jpg`` (photo-like, (H, W) drawn from ``size`` = ((min_h, max_h),
    (min_w, max_w))) and ``root/instances.json``: image ids not in file order, about
    ``empty_fraction`` of images without annotations, 1-``max_objects`` objects on the others
    with 1-3 polygons each, ``crowd_fraction`` of them iscrowd with an uncompressed RLE,
    ``string_rle_fraction`` with a compressed RLE, and ``int_box_fraction`` of images with
    integer boxes (int64 boxes in torchvision)."""
    if n_images <= 0:
        raise ValueError(f"`n_images` must be > 0. Found: {n_images}.")
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    ids = rng.permutation(np.arange(1, 3 * n_images + 1))[:n_images]
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for k in range(n_images):
        h = int(rng.integers(size[0][0], size[0][1] + 1))
        w = int(rng.integers(size[1][0], size[1][1] + 1))
        name = f"img_{k:05d}.jpg"
        (root / "images" / name).write_bytes(encode(photo_like(h, w, seed=rng), quality=quality))
        image_id = int(ids[k])
        images.append({"id": image_id, "file_name": name, "height": h, "width": w})
        if rng.random() < empty_fraction:
            continue
        int_boxes = rng.random() < int_box_fraction
        for _ in range(int(rng.integers(1, max_objects + 1))):
            bw, bh = rng.uniform(4, w * 0.6), rng.uniform(4, h * 0.6)
            box = (rng.uniform(0, w - bw), rng.uniform(0, h - bh), bw, bh)
            bbox: list[Any] = ([int(v) for v in box] if int_boxes
                               else [round(float(v), 2) for v in box])
            ann: dict[str, Any] = {"id": len(annotations) + 1, "image_id": image_id,
                                   "category_id": int(rng.integers(1, num_categories + 1)),
                                   "bbox": bbox, "iscrowd": 0}
            draw = rng.random()
            if draw < crowd_fraction:
                seg: Any = _uncompressed_rle(_ellipse_mask(rng, box, (h, w)))
                ann["iscrowd"] = 1
            elif draw < crowd_fraction + string_rle_fraction:
                from pycocotools import mask as mask_utils  # only for these (string_rle_fraction)

                rle = mask_utils.encode(np.asfortranarray(_ellipse_mask(rng, box, (h, w))))
                seg = {"size": [h, w], "counts": rle["counts"].decode("ascii")}
            else:
                seg = [_polygon(rng, box) for _ in range(int(rng.integers(1, 4)))]
            ann["segmentation"] = seg
            ann["area"] = round(float(bw * bh), 2)
            annotations.append(ann)
    categories = [{"id": c, "name": f"category_{c}", "supercategory": "thing"}
                  for c in range(1, num_categories + 1)]
    ann_file = root / "instances.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": annotations,
                                    "categories": categories}))
    return SynthCoco(root / "images", ann_file, n_images, len(annotations))


def voc_palette() -> bytes:
    """PASCAL VOC's 256-colour palette (768 bytes, RGB)."""
    out = bytearray()
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out += bytes((r, g, b))
    return bytes(out)


def palette_png(indices: np.ndarray, palette: bytes | None = None) -> bytes:
    """An 8-bit palette PNG (colour type 3) of ``indices`` ((H, W) uint8)."""
    h, w = indices.shape

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(
            ">I", zlib.crc32(tag + body) & 0xFFFFFFFF)

    rows = np.concatenate([np.zeros((h, 1), np.uint8), indices.astype(np.uint8)], axis=1)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
            + chunk(b"PLTE", palette or voc_palette())
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))


def make_segmentation(root: str | os.PathLike, n: int, *,
                      size: tuple[tuple[int, int], tuple[int, int]] = ((160, 320), (200, 400)),
                      num_classes: int = 21, seed: int = 0, quality: int = 90) -> SynthSegmentation:
    """Write ``root/JPEGImages/*.jpg`` and ``root/SegmentationClass/*.png`` (VOC's layout):
    photo-like images and palette-PNG masks of class indices 0-``num_classes - 1`` with
    255-valued borders around the objects, as VOC's."""
    import cv2

    if n <= 0:
        raise ValueError(f"`n` must be > 0. Found: {n}.")
    rng = np.random.default_rng(seed)
    root = Path(root)
    images, masks = root / "JPEGImages", root / "SegmentationClass"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    image_paths, mask_paths = [], []
    for k in range(n):
        h = int(rng.integers(size[0][0], size[0][1] + 1))
        w = int(rng.integers(size[1][0], size[1][1] + 1))
        mask = np.zeros((h, w), dtype=np.uint8)
        for _ in range(int(rng.integers(1, 5))):
            cls = int(rng.integers(1, num_classes))
            center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            axes = (int(rng.integers(5, w // 3 + 6)), int(rng.integers(5, h // 3 + 6)))
            angle = float(rng.uniform(0, 180))
            cv2.ellipse(mask, center, axes, angle, 0, 360, 255, 3)
            cv2.ellipse(mask, center, axes, angle, 0, 360, cls, -1)
        stem = f"2007_{k:06d}"
        image_paths.append(images / f"{stem}.jpg")
        mask_paths.append(masks / f"{stem}.png")
        image_paths[-1].write_bytes(encode(photo_like(h, w, seed=rng), quality=quality))
        mask_paths[-1].write_bytes(palette_png(mask))
    return SynthSegmentation(images, masks, tuple(image_paths), tuple(mask_paths))
