"""Detection and segmentation: FastLoader against torch's DataLoader with the same
torchvision v2 pipeline, data and collate, and against an Albumentations 2.0.8 pipeline that is
*equivalent, not identical* (its own ops and draws), every loader in one run, alternating
rounds (``compare(..., rotate=True)``); one table of rows, each a ratio against its goal.

    PYTHONPATH=$PWD .venv-tv/bin/python -m benchmarks.detection [OUT] [--images 384] [--workers 2]
        [--batch-size 32] [--batches 0] [--rounds 3] [--recipes det_ssd,inst_seg,sem_seg]
        [--peers-only] [--json OUT.json]

OUT (default ./demo-detection) holds the data, written once (``benchmarks/_coco_data.py``):
photo-like JPEGs of 480-640 px a side with a COCO instances JSON (2-8 polygon objects each), and
as many JPEG + palette PNG mask pairs. ``--batches 0``: one epoch per round.

Recipes (:data:`RECIPES`; the same ``batch_size``, ``num_workers``, ``shuffle=True`` with
generators seeded alike, and the same ``collate_fn`` for every loader of a recipe):

- ``det_ssd``: torchvision's detection references, ``DetectionPresetTrain(data_augmentation=
  "ssd", use_v2=True)`` (backend PIL): RandomPhotometricDistort() (the references' default,
  p=0.5 per sub-op), RandomZoomOut(fill=defaultdict(lambda: mean, {Mask: 0})) (which fills the
  image with 0, not the mean: v2's ``_get_fill`` tests ``in``, so the default is never used),
  RandomIoUCrop(),
  RandomHorizontalFlip(0.5), then Resize((320, 320)) (added for the benchmark, on the PIL image
  after the flip: the cheaper place for the peer), ToImage, ToDtype(float, scale=True),
  ConvertBoundingBoxFormat(XYXY), SanitizeBoundingBoxes, ToPureTensor; ``target_keys`` boxes,
  labels, image_id (the references'); ``collate_fn`` :func:`zip_collate` (``tuple(zip(*b))``,
  the references' ``utils.collate_fn``). DataLoader: ``wrap_dataset_for_transforms_v2(
  torchvision.datasets.CocoDetection(root, ann, transforms=preset), target_keys)`` as the
  references' ``get_coco`` (the wrapper takes the dataset's ``transforms`` and applies them
  after wrapping); FastLoader: ``gpufeed.CocoDetection(root, ann, transforms=preset,
  target_keys=...)``;
- ``inst_seg``: ``target_keys`` boxes, labels, masks; RandomResizedCrop(256),
  RandomHorizontalFlip, ToImage, ToDtype(float32, scale=True), ToPureTensor; the same two
  loaders, :func:`zip_collate`;
- ``det_hflip``, ``det_ssdlite``, ``det_multiscale`` (``--recipes`` only; no goal, no
  Albumentations peer): the references' other presets (:func:`reference_preset`), image sizes
  kept, the SSD recipe's keys, loaders and collate;
- ``seg_preset`` (``--recipes`` only; no goal): image + palette PNG mask pairs through the
  segmentation references' preset object, ``SegmentationPresetTrain(base_size=520,
  crop_size=480)`` (``benchmarks/_presets.py``; backend PIL, as the references' ``train.py``
  passes it): RandomResize(260, 1040), RandomHorizontalFlip, PadIfSmaller(480, fill 255 for the
  mask, 0 else), RandomCrop(480), PILToTensor, ToDtype(image float32 scaled, mask int64),
  Normalize(ImageNet), ToPureTensor; the loaders of ``sem_seg`` and ``default_collate`` (fixed
  480 x 480 crops: the references' ``utils.collate_fn`` pads to the largest, which is stacking
  here); the Albumentations peer ``_albu.albu_seg_preset``;
- ``sem_seg``: image + palette PNG mask pairs; RandomResizedCrop(256), RandomHorizontalFlip,
  ToImage, ToDtype(float32, scale=True), ToPureTensor on (image, ``tv_tensors.Mask``);
  DataLoader over :class:`SegmentationPairs` (PIL image and mask, the mask wrapped as
  torchvision's VOCSegmentation wrapper does); FastLoader over ``gpufeed.SegmentationDataset(
  images, masks, transforms=...)``; ``default_collate`` (fixed 256 x 256 outputs).

The Albumentations peers (``benchmarks/_albu.py``: cv2 reads, masks of COCO objects from
pycocotools, cv2 single-threaded in each DataLoader worker as Albumentations advises) run their
ops' nearest equivalents (each function's docstring) twice: with Albumentations' default
bilinear resampling, which does not antialias a shrink (the cheaper pipeline; "Albumentations"),
and with ``area_for_downscale="image"`` (``INTER_AREA`` for a shrinking image: "Albumentations
antialiased"), nearer torchvision's antialiased pixels (``_albu.resampling_gap``, printed by
``detection_ops.py``).

Goals (``benchmarks/_goals.py``, :data:`DETECTION_GOALS`): FastLoader >= 2.0x DataLoader and
>= 1.5x Albumentations images/s (its default pipeline), for every recipe; the rows against the
antialiased peer and Albumentations-vs-DataLoader have no goal (context). Until
``gpufeed.CocoDetection`` / ``gpufeed.SegmentationDataset`` exist in the checkout (or with
``--peers-only``) the gpufeed rows print "gpufeed side: not available in this checkout" and the
peers still run. Needs ``.venv-tv`` (torchvision, pycocotools,
albumentations==2.0.8: ``make`` installs them there).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._albu import AlbuCoco, AlbuSegmentation, albu_crop_flip, albu_seg_preset, albu_ssd, cv2_one_thread
from benchmarks._coco_data import CocoData, SegmentationData, prepare
from benchmarks._common import uptime
from benchmarks._goals import DETECTION_GOALS
from benchmarks.tasks import Factories, Row, Task, format_rows, row_report

SSD_SIZE = (320, 320)
CROP = 256
SEG_BASE, SEG_CROP = 520, 480  # the segmentation references' train.py: base_size, crop_size
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # the segmentation preset's Normalize
MEAN = (123.0, 117.0, 104.0)  # the references' zoom-out fill (0-255; v2 fills the image with 0)
SSD_KEYS = ("boxes", "labels", "image_id")
INST_KEYS = ("boxes", "labels", "masks")
NOT_AVAILABLE = "gpufeed side: not available in this checkout"


def zip_collate(batch: Sequence[Any]) -> tuple[Any, ...]:
    """``tuple(zip(*batch))``: the detection references' ``utils.collate_fn`` (a module
    function, so that workers of any start method can take it)."""
    return tuple(zip(*batch))


def _default_collate(batch: list[Any]) -> Any:
    return torch.utils.data.default_collate(batch)


# -- torchvision v2 pipelines ---------------------------------------------------------------

def ssd_preset() -> Any:
    """The references' SSD preset (module docstring) with Resize(SSD_SIZE) after the flip."""
    from collections import defaultdict

    import torchvision.transforms.v2 as V
    from torchvision import tv_tensors

    fill = defaultdict(lambda: MEAN, {tv_tensors.Mask: 0})
    return V.Compose([
        V.RandomPhotometricDistort(), V.RandomZoomOut(fill=fill), V.RandomIoUCrop(),
        V.RandomHorizontalFlip(p=0.5), V.Resize(SSD_SIZE),
        V.ToImage(), V.ToDtype(torch.float, scale=True),
        V.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY), V.SanitizeBoundingBoxes(),
        V.ToPureTensor(),
    ])


def reference_preset(kind: str) -> Any:
    """The references' other ``DetectionPresetTrain(data_augmentation=kind, use_v2=True)``
    pipelines (backend PIL), unchanged: "hflip" (RandomHorizontalFlip), "ssdlite"
    (RandomIoUCrop, RandomHorizontalFlip) or "multiscale" (RandomShortestSize(480-800 by 32,
    max_size=1333), RandomHorizontalFlip); then PILToTensor, ToDtype(float, scale=True),
    ConvertBoundingBoxFormat(XYXY), SanitizeBoundingBoxes, ToPureTensor. Images keep
    their sizes: :func:`zip_collate`."""
    import torchvision.transforms.v2 as V
    from torchvision import tv_tensors

    ops = {
        "hflip": [V.RandomHorizontalFlip(p=0.5)],
        "ssdlite": [V.RandomIoUCrop(), V.RandomHorizontalFlip(p=0.5)],
        "multiscale": [V.RandomShortestSize(min_size=tuple(range(480, 801, 32)), max_size=1333),
                       V.RandomHorizontalFlip(p=0.5)],
    }[kind]
    return V.Compose([*ops, V.PILToTensor(), V.ToDtype(torch.float, scale=True),
                      V.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY), V.SanitizeBoundingBoxes(),
                      V.ToPureTensor()])


def crop_flip() -> Any:
    """RandomResizedCrop(CROP), RandomHorizontalFlip, ToImage, ToDtype(float32), ToPureTensor:
    ``inst_seg``'s and ``sem_seg``'s pipeline."""
    import torchvision.transforms.v2 as V

    return V.Compose([V.RandomResizedCrop(CROP), V.RandomHorizontalFlip(p=0.5), V.ToImage(),
                      V.ToDtype(torch.float32, scale=True), V.ToPureTensor()])


class SegmentationPairs(torch.utils.data.Dataset):
    """(image, mask) file pairs read with PIL, the mask as ``tv_tensors.Mask`` (1, H, W) of
    class indices (torchvision's VOCSegmentation and its v2 wrapper), through ``transforms``."""

    def __init__(self, data: SegmentationData, transforms: Any) -> None:
        self.images, self.masks, self.transforms = data.images, data.masks, transforms

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from PIL import Image
        from torchvision import tv_tensors

        image = Image.open(self.images[index]).convert("RGB")
        return self.transforms(image, tv_tensors.Mask(Image.open(self.masks[index])))


# -- loaders, rows ------------------------------------------------------------------------

class Counted:
    """A loader whose batches count their images by the collate's own layout (images first):
    ``batch_size_of`` guesses it from the batch's structure, which a zip of image and mask
    tensors would mislead; here a batch is a :class:`Batch`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            yield Batch(batch)


class Batch:
    """One batch and its image count: ``len`` is the length of its first element."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch[0])


def consume(batch: Batch) -> int:
    """``compare``'s default consumer (one byte per page) on the batch inside."""
    from gpufeed.compare._compare import touch_pages

    return touch_pages(batch.batch)


def gpufeed_available(recipe: str) -> bool:
    """Whether this checkout's gpufeed has the dataset class ``recipe`` needs."""
    import gpufeed

    return hasattr(gpufeed, "SegmentationDataset" if recipe in SEGMENTATION else "CocoDetection")


def _loader_kw(batch_size: int, num_workers: int, seed: int, collate: Callable[..., Any]) -> dict[str, Any]:
    return dict(batch_size=batch_size, num_workers=num_workers, shuffle=True, collate_fn=collate,
                generator=torch.Generator().manual_seed(seed))


def recipe_task(name: str, coco: CocoData, seg: SegmentationData, *, batch_size: int, num_workers: int,
                seed: int = 0, peers_only: bool = False) -> Task:
    """The loaders (DataLoader, Albumentations with and without antialiasing, and FastLoader
    unless unavailable or ``peers_only``) and rows of recipe ``name`` (goals for :data:`RECIPES`
    only; the goal against Albumentations is on its default, unantialiased pipeline)."""
    import torchvision
    from torch.utils.data import DataLoader

    if name in PRESET_RECIPES and name not in SEGMENTATION:
        return preset_task(name, coco, batch_size=batch_size, num_workers=num_workers, seed=seed,
                           peers_only=peers_only)
    if name not in RECIPES and name not in SEGMENTATION:
        raise ValueError(f"`recipes` must name recipes of {sorted(RECIPES) + sorted(PRESET_RECIPES)}. "
                         f"Found: {name!r}.")
    collate = _default_collate if name in SEGMENTATION else zip_collate
    kw = lambda: _loader_kw(batch_size, num_workers, seed, collate)  # noqa: E731 - a fresh generator per loader
    if name == "seg_preset":
        from benchmarks._presets import SegmentationPresetTrain

        transforms: Any = SegmentationPresetTrain(base_size=SEG_BASE, crop_size=SEG_CROP)
    else:
        transforms = ssd_preset() if name == "det_ssd" else crop_flip()
        keys = list(SSD_KEYS if name == "det_ssd" else INST_KEYS)
    if name in SEGMENTATION:
        theirs: Any = SegmentationPairs(seg, transforms)
    else:
        theirs = torchvision.datasets.wrap_dataset_for_transforms_v2(
            torchvision.datasets.CocoDetection(str(coco.root), str(coco.ann_file), transforms=transforms),
            target_keys=keys)
    loaders: Factories = {
        f"{name} DataLoader": lambda: Counted(DataLoader(theirs, **kw())),
    }
    for suffix, antialias in (("", False), (" antialiased", True)):
        albu = albu_dataset(name, coco, seg, antialias=antialias)
        loaders[f"{name} Albumentations{suffix}"] = (
            lambda albu=albu: Counted(DataLoader(albu, **kw(), worker_init_fn=cv2_one_thread)))
    if not peers_only and gpufeed_available(name):
        import gpufeed

        if name in SEGMENTATION:
            ours: Any = gpufeed.SegmentationDataset(list(seg.images), list(seg.masks), transforms=transforms)
        else:
            ours = gpufeed.CocoDetection(str(coco.root), str(coco.ann_file), transforms=transforms,
                                         target_keys=keys)
        loaders[f"{name} gpufeed"] = lambda: Counted(gpufeed.FastLoader(ours, **kw(), seed=seed))
    goals: dict[str, float | None] = dict(DETECTION_GOALS) if name in RECIPES else {}
    return Task(loaders, (
        Row(f"{name} vs DataLoader", f"{name} gpufeed", f"{name} DataLoader", goals.get("vs DataLoader")),
        Row(f"{name} vs Albumentations (equivalent)", f"{name} gpufeed", f"{name} Albumentations",
            goals.get("vs Albumentations")),
        Row(f"{name} vs Albumentations antialiased", f"{name} gpufeed", f"{name} Albumentations antialiased"),
        Row(f"{name} Albumentations vs DataLoader", f"{name} Albumentations", f"{name} DataLoader"),
    ))


def albu_dataset(name: str, coco: CocoData, seg: SegmentationData, *, antialias: bool) -> Any:
    """Recipe ``name``'s Albumentations peer (``benchmarks/_albu.py``) on the recipe's data;
    ``antialias``: shrinking resizes by ``INTER_AREA`` (``area_for_downscale="image"``)."""
    if name == "sem_seg":
        return AlbuSegmentation(seg, albu_crop_flip(CROP, boxes=False, antialias=antialias))
    if name == "seg_preset":
        return AlbuSegmentation(seg, albu_seg_preset(SEG_BASE, SEG_CROP, IMAGENET, antialias=antialias),
                                mask_dtype=torch.int64)
    if name == "det_ssd":
        return AlbuCoco(coco, albu_ssd(SSD_SIZE, antialias=antialias), masks=False)
    return AlbuCoco(coco, albu_crop_flip(CROP, boxes=True, antialias=antialias), masks=True)


def preset_task(name: str, coco: CocoData, *, batch_size: int, num_workers: int, seed: int = 0,
                peers_only: bool = False) -> Task:
    """A references' preset recipe (:data:`PRESET_RECIPES`): DataLoader over torchvision's
    wrapped ``CocoDetection`` and FastLoader over ``gpufeed.CocoDetection``, the references'
    ``target_keys`` and collate; one row, no goal (``DETECTION_GOALS`` are the default recipes')."""
    import torchvision
    from torch.utils.data import DataLoader

    transforms = reference_preset(name.removeprefix("det_"))
    kw = lambda: _loader_kw(batch_size, num_workers, seed, zip_collate)  # noqa: E731 - a fresh generator per loader
    theirs = torchvision.datasets.wrap_dataset_for_transforms_v2(
        torchvision.datasets.CocoDetection(str(coco.root), str(coco.ann_file), transforms=transforms),
        target_keys=list(SSD_KEYS))
    loaders: Factories = {f"{name} DataLoader": lambda: Counted(DataLoader(theirs, **kw()))}
    if not peers_only and gpufeed_available(name):
        import gpufeed

        ours = gpufeed.CocoDetection(str(coco.root), str(coco.ann_file), transforms=transforms,
                                     target_keys=list(SSD_KEYS))
        loaders[f"{name} gpufeed"] = lambda: Counted(gpufeed.FastLoader(ours, **kw(), seed=seed))
    return Task(loaders, (Row(f"{name} vs DataLoader", f"{name} gpufeed", f"{name} DataLoader"),))


#: recipe name -> what it measures (the module docstring has the pipelines); the default run
RECIPES = {
    "det_ssd": "COCO boxes, the references' SSD preset + Resize((320, 320))",
    "inst_seg": "COCO boxes + masks, RandomResizedCrop(256) + flip",
    "sem_seg": "image + palette mask pairs, RandomResizedCrop(256) + flip",
}

#: the references' other detection presets and the segmentation train preset (``--recipes``; not
#: in the default run): no goal; DataLoader only, and Albumentations too for ``seg_preset``
PRESET_RECIPES = {
    "det_hflip": "COCO boxes, the references' hflip preset (sizes kept)",
    "det_ssdlite": "COCO boxes, the references' ssdlite preset (IoU crop + flip, sizes kept)",
    "det_multiscale": "COCO boxes, the references' multiscale preset (shortest side 480-800)",
    "seg_preset": "image + palette mask pairs, the segmentation references' train preset (crop 480)",
}

#: the recipes on image + mask pairs (``SegmentationPairs`` / ``gpufeed.SegmentationDataset``,
#: ``default_collate``)
SEGMENTATION = ("sem_seg", "seg_preset")


def reports(result: Any, rows: Sequence[Row], loaders: Factories) -> list[dict[str, Any]]:
    """``tasks.row_report`` for each row whose loaders ran; the others say why not."""
    out = []
    for row in rows:
        if row.ours in loaders and row.peer in loaders:
            out.append(row_report(result, row))
        else:
            peer = result.summary(row.peer).median_samples_per_s if row.peer in loaders else float("nan")
            out.append({"ours_images_per_s": float("nan"), "peer_images_per_s": peer, "ratio": float("nan"),
                        "paired": [], "target": row.target, "status": "not run", "detail": NOT_AVAILABLE})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="demo-detection")
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=0, help="per round; 0: one epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--peers-only", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from gpufeed.cli.bench import write
    from gpufeed.compare._compare import compare
    from gpufeed.compare._environment import describe_environment

    coco, seg = prepare(args.out, args.images)
    env = describe_environment(args.workers)
    env["uptime_before"] = uptime()
    for module in ("torchvision", "albumentations", "pycocotools"):
        env[module] = getattr(__import__(module), "__version__", "?")
    loaders: Factories = {}
    rows: list[Row] = []
    for name in (r for r in args.recipes.split(",") if r):
        task = recipe_task(name, coco, seg, batch_size=args.batch_size, num_workers=args.workers,
                           peers_only=args.peers_only)
        loaders.update(task.loaders)
        rows.extend(task.rows)
    result = compare(loaders, num_batches=args.batches or None, num_rounds=args.rounds,
                     num_warmup_rounds=args.warmup, environment=env, rotate=True, consume=consume)
    env["uptime_after"] = uptime()
    write(result.format_table())
    reps = reports(result, rows, loaders)
    write("")
    for line in format_rows(rows, reps):
        write(line)
    for row, rep in zip(rows, reps):
        if rep["status"] not in ("met", "no target"):
            write(f"  {row.name}: {rep['status']} ({rep['detail']})")
    write(f"data: {coco.num_images} COCO images ({coco.num_objects} objects), {len(seg.images)} mask pairs, "
          f"in {args.out}")
    write(f"uptime before: {env['uptime_before']}\nuptime after:  {env['uptime_after']}")
    if args.json:
        out = {"compare": result.to_dict(), "uptime_after": env["uptime_after"],
               "rows": {row.name: rep for row, rep in zip(rows, reps)}}
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
