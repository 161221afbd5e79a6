"""Per-op cost of the detection ops: torchvision v2 on ``tv_tensors`` (an Image of
uint8, BoundingBoxes XYXY, a Mask of the objects' planes, labels) against gpufeed's joint op of
the same name and arguments (``gpufeed.image.detection``, or its private modules for an op
not exported yet: :func:`joint_op`) on a ``Sample`` (HWC uint8, ``Boxes``,
a dense ``Mask``, labels) with the masks read out (``Mask.dense``, as the output stage does);
and COCO mask decoding: pycocotools' full decode of every object (torchvision's v2 wrapper)
against gpufeed's lazy decode of the rows and columns a RandomResizedCrop(256) keeps; and
how far the Albumentations peers' resampling is from torchvision's (``_albu.resampling_gap``). One
thread (torch and OpenCV), ms per image, alternating rounds, medians; one run.

    PYTHONPATH=$PWD .venv-tv/bin/python -m benchmarks.detection_ops [OUT] [--images 16]
        [--rounds 5] [--reps 32] [--ops RandomIoUCrop,...]

OUT (default ./demo-detection) is ``benchmarks/detection.py``'s data (``_coco_data.prepare``):
the first ``--images`` COCO images (480-640 px a side, 2-8 polygon objects), cycled. Ops drawn
at p=1 where they have a p (RandomPhotometricDistort(p=1.0): every sub-op, the most it costs;
RandomZoomOut(p=1.0), RandomHorizontalFlip(p=1.0)). A gpufeed name not in this checkout (the
ops are being written) prints a line saying so instead of its figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks._coco_data import CocoData, prepare

MEAN = (123.0, 117.0, 104.0)


def op_cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, constructor kwargs) of every op measured, the same for both libraries."""
    from collections import defaultdict

    from torchvision import tv_tensors

    fill = defaultdict(lambda: MEAN, {tv_tensors.Mask: 0})
    return [
        ("RandomPhotometricDistort", dict(p=1.0)),
        ("RandomZoomOut", dict(fill=fill, p=1.0)),
        ("RandomIoUCrop", {}),
        ("RandomHorizontalFlip", dict(p=1.0)),
        ("Resize", dict(size=(320, 320))),
        ("RandomResizedCrop", dict(size=256)),
        ("RandomAffine", dict(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2))),
        # the segmentation references' preset (base 520, crop 480)
        ("RandomResize", dict(min_size=260, max_size=1040)),
        ("RandomCrop", dict(size=480, pad_if_needed=True)),
    ]


@dataclass(frozen=True)
class Item:
    """One image's inputs: HWC uint8, (N, 4) XYXY float boxes, (N, H, W) uint8 masks, labels."""

    image: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray
    labels: np.ndarray


def load_items(coco: CocoData, count: int) -> list[Item]:
    """The first ``count`` images of ``coco``, decoded, and their objects' dense masks."""
    from PIL import Image
    from pycocotools.coco import COCO

    api = COCO(str(coco.ann_file))
    items = []
    for image_id in sorted(api.imgs)[:count]:
        anns = api.loadAnns(api.getAnnIds(imgIds=image_id))
        image = np.array(Image.open(coco.root / api.imgs[image_id]["file_name"]).convert("RGB"))
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float64)
        items.append(Item(image, boxes, np.stack([api.annToMask(a) for a in anns]),
                          np.array([a["category_id"] for a in anns], np.int64)))
    return items


def torchvision_call(op: Any, items: list[Item]) -> Callable[[int], Any]:
    """``op`` on the tv_tensors of item ``i % len(items)`` (built once, outside the timing)."""
    import torch
    from torchvision import tv_tensors

    inputs = []
    for it in items:
        h, w = it.image.shape[:2]
        inputs.append((tv_tensors.Image(torch.from_numpy(it.image).permute(2, 0, 1).contiguous()),
                       {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(it.boxes).float(), format="XYXY",
                                                          canvas_size=(h, w)),
                        "masks": tv_tensors.Mask(torch.from_numpy(it.masks)),
                        "labels": torch.from_numpy(it.labels)}))
    return lambda i: op(*inputs[i % len(inputs)])


def gpufeed_call(op: Any, items: list[Item], masks: bool = True) -> Callable[[int], Any]:
    """``op`` on a fresh ``Sample`` of item ``i % len(items)`` (the arrays shared, the leaves
    new: ops may change them), then the image made contiguous (a flip or crop may be a view:
    the output stage copies it) and, with ``masks``, every mask read out (``Mask.dense``: the
    output stage reads them once per pipeline; here each op pays it)."""
    from gpufeed.image.detection import Boxes, Mask, Sample

    rng = np.random.default_rng(0)

    def call(i: int) -> Any:
        it = items[i % len(items)]
        target = {"boxes": Boxes(it.boxes.copy(), "XYXY", it.image.shape[:2]), "masks": Mask(data=it.masks),
                  "labels": it.labels}
        out = op(Sample(it.image, target), rng)
        image = np.ascontiguousarray(out.image)
        return image, [leaf.dense() for leaf in out.leaves() if isinstance(leaf, Mask)] if masks else None

    return call


def pycocotools_decode(coco: CocoData, count: int) -> Callable[[int], Any]:
    """Every object's mask of image ``i``, as torchvision's wrapper makes them (polygons ->
    RLE at the image size, merged, decoded; stacked)."""
    from pycocotools import mask as cmask
    from pycocotools.coco import COCO

    api = COCO(str(coco.ann_file))
    per_image = []
    for image_id in sorted(api.imgs)[:count]:
        info = api.imgs[image_id]
        per_image.append((info["height"], info["width"],
                          [a["segmentation"] for a in api.loadAnns(api.getAnnIds(imgIds=image_id))]))

    def call(i: int) -> Any:
        h, w, segs = per_image[i % len(per_image)]
        return np.stack([cmask.decode(cmask.merge(cmask.frPyObjects(s, h, w))) for s in segs])

    return call


def gpufeed_lazy_decode(coco: CocoData, count: int) -> Callable[[int], Any] | str:
    """Image ``i``'s target from ``gpufeed.CocoDetection`` (``read_item`` + ``target_of``: lazy
    masks), a 256 x 256 selection of its centre half (a RandomResizedCrop's maps), read out;
    or why it cannot run in this checkout."""
    import io

    from PIL import Image

    import gpufeed
    from gpufeed.image.detection import Mask
    from gpufeed.image.detection._sample import torch_nearest_index as nearest

    if not hasattr(gpufeed, "CocoDetection"):
        return "gpufeed.CocoDetection: not in this checkout"
    ds = gpufeed.CocoDetection(str(coco.root), str(coco.ann_file), target_keys=["boxes", "labels", "masks"])
    records = [ds.read_item(i) for i in range(min(count, len(ds)))]
    # (H, W) of each image from its header, outside the timing (the decoder's size in a worker)
    canvases = [Image.open(io.BytesIO(bytes(blob))).size[::-1] for blob, _ in records]

    def call(i: int) -> Any:
        index = i % len(records)
        target = ds.target_of(index, records[index][1], canvases[index])
        out = []
        for leaf in _leaves(target):
            if isinstance(leaf, Mask):
                h, w = leaf.size
                rows = h // 4 + nearest(h // 2, 256)
                cols = w // 4 + nearest(w // 2, 256)
                leaf.select(rows, cols)
                out.append(leaf.dense())
        return out

    return call


def _leaves(target: Any) -> list[Any]:
    from gpufeed.image.detection._sample import map_leaves

    out: list[Any] = []

    def keep(leaf: Any) -> Any:
        out.append(leaf)
        return leaf

    map_leaves(target, keep)
    return out


def _time(fn: Callable[[int], Any], reps: int, start: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + reps):
        fn(i)
    return (time.perf_counter() - t0) / reps


Call = Callable[[int], Any]
#: (name, torchvision's call, gpufeed's call or why not, gpufeed's call without the masks' read-out)
Pair = tuple[str, Call, "Call | str", "Call | None"]


def measure(pairs: list[Pair], rounds: int, reps: int) -> list[str]:
    """Lines of the table: each pair's calls timed alternating, ``rounds`` rounds of ``reps``
    calls each; ms per image, medians."""
    w = max(len("op"), *(len(p[0]) for p in pairs))
    lines = [f"{'op':{w}s} {'torchvision ms':>14s} {'gpufeed ms':>11s} {'tv/gpufeed':>11s} {'w/o masks':>10s}"]
    for name, theirs, ours, lite in pairs:
        times: list[list[float]] = [[], [], []]
        for r in range(rounds):
            for k, fn in enumerate((theirs, ours, lite)):
                if callable(fn):
                    times[k].append(_time(fn, reps, r * reps))
        mb = statistics.median(times[0]) * 1e3
        if isinstance(ours, str):
            lines.append(f"{name:{w}s} {mb:14.2f} {'-':>11s} {'-':>11s} {'-':>10s}  ({ours})")
            continue
        ma = statistics.median(times[1]) * 1e3
        ml = f"{statistics.median(times[2]) * 1e3:10.2f}" if times[2] else f"{'-':>10s}"
        lines.append(f"{name:{w}s} {mb:14.2f} {ma:11.2f} {mb / ma:10.2f}x {ml}")
    return lines


def joint_op(name: str) -> type | None:
    """gpufeed's joint op ``name``: ``gpufeed.image.detection.<name>``, else the ``JointOp``
    subclass of that name in one of the package's private modules (ops not exported yet)."""
    import importlib
    import pkgutil

    import gpufeed.image.detection as D

    found = getattr(D, name, None)
    if found is not None:
        return found
    for info in pkgutil.iter_modules(D.__path__):
        module = importlib.import_module(f"{D.__name__}.{info.name}")
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, D.JointOp):
            return cls
    return None


def build_pairs(coco: CocoData, images: int, ops: list[str] | None = None) -> list[Pair]:
    """A :data:`Pair` for every case (``ops``: a subset of the op names; "decode" for the COCO
    mask row)."""
    import torchvision.transforms.v2 as V

    items = load_items(coco, images)
    pairs: list[Pair] = []
    for name, kwargs in op_cases():
        if ops is not None and name not in ops:
            continue
        label = f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items() if k != 'fill')})"
        theirs = torchvision_call(getattr(V, name)(**kwargs), items)
        cls = joint_op(name)
        if cls is None:
            pairs.append((label, theirs, f"gpufeed.image.detection.{name}: not in this checkout", None))
            continue
        try:
            op = cls(**kwargs)
        except (TypeError, ValueError) as exc:
            pairs.append((label, theirs, f"gpufeed.image.detection.{name}({kwargs}) refused: {exc}", None))
            continue
        pairs.append((label, theirs, gpufeed_call(op, items), gpufeed_call(op, items, masks=False)))
    if ops is None or "decode" in ops:
        pairs.append(("COCO masks: full vs lazy crop decode", pycocotools_decode(coco, images),
                      gpufeed_lazy_decode(coco, images), None))
    return pairs


def resampling_line(coco: CocoData, images: int) -> str:
    """The Albumentations peers' resampling against torchvision's (``_albu.resampling_gap``) on
    the first ``images`` COCO images."""
    from benchmarks._albu import resampling_gap
    from benchmarks.detection import CROP

    paths = sorted(str(p) for p in coco.root.glob("*.jpg"))[:images]
    gap = resampling_gap(paths, CROP)
    return (f"resampling: a random box to {CROP} x {CROP}, mean |difference| from torchvision's antialiased "
            f"resized_crop over {len(paths)} images: Albumentations bilinear {gap['linear']:.2f} levels, "
            f"area_for_downscale='image' {gap['area']:.2f}")


def main(argv: list[str] | None = None) -> int:
    import cv2
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="demo-detection")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--data-images", type=int, default=384, help="the data set's size (detection.py's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=32)
    parser.add_argument("--ops", help="comma-separated op names (and 'decode', 'resampling'); default all")
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    coco, _ = prepare(args.out, max(args.data_images, args.images))
    ops = [o for o in args.ops.split(",") if o] if args.ops else None
    pairs = build_pairs(coco, args.images, ops)
    for line in measure(pairs, args.rounds, args.reps) if pairs else ():
        print(line)
    if ops is None or "resampling" in ops:
        print(resampling_line(coco, args.images))
    print(f"({args.images} images of 480-640 px, {args.rounds} rounds x {args.reps} calls, one thread; "
          f"gpufeed ms: the op, its image made contiguous and its masks read out (once per pipeline "
          f"in a loader, here once per op); w/o masks: without that read-out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
