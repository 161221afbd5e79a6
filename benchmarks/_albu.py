"""The Albumentations 2.0.8 peers of ``detection.py``: pipelines *equivalent, not identical* to
the torchvision v2 recipes (their own ops and draws), and the datasets that run them (cv2
reads; COCO masks from pycocotools; cv2 single-threaded in each DataLoader worker, as
Albumentations advises).

Resampling: torchvision's ``Resize`` and ``RandomResizedCrop`` antialias a shrink (PIL always
does; tensors by default), Albumentations' bilinear resize does not. Each pipeline comes in two
forms: ``antialias=False``, Albumentations' defaults (bilinear without antialiasing: the cheaper
pipeline), and ``antialias=True``, the same ops with ``area_for_downscale="image"``,
Albumentations' own switch to ``INTER_AREA`` for a shrinking image (masks stay nearest).
:func:`resampling_gap` measures how far each form's pixels are from torchvision's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks._coco_data import CocoData, SegmentationData


def _area(antialias: bool) -> str | None:
    """Albumentations' ``area_for_downscale``: "image" antialiases a shrinking image."""
    return "image" if antialias else None


def _bbox_params() -> Any:
    import albumentations as A

    # min 1 px a side: SanitizeBoundingBoxes' default min_size
    return A.BboxParams(format="pascal_voc", label_fields=["labels", "ids"], min_width=1, min_height=1,
                        clip=True)


def albu_ssd(size: tuple[int, int], *, antialias: bool = False) -> Any:
    """SSD, equivalent not identical: ColorJitter with RandomPhotometricDistort's ranges (all four
    at once, p=0.5) and ChannelShuffle(0.5); CropAndPad(percent 0-150% a side, fill 0 as
    torchvision's zoom-out gives, p=0.5) for the zoom-out (canvas 1-4x); BBoxSafeRandomCrop for
    the IoU crop (keeps every box); HorizontalFlip; Resize(``size``); ToFloat; ToTensorV2."""
    import albumentations as A
    from albumentations.pytorch import ToTensorV2

    return A.Compose([
        A.ColorJitter(brightness=(0.875, 1.125), contrast=(0.5, 1.5), saturation=(0.5, 1.5),
                      hue=(-0.05, 0.05), p=0.5),
        A.ChannelShuffle(p=0.5),
        A.CropAndPad(percent=(0.0, 1.5), keep_size=False, sample_independently=True, fill=0,
                     fill_mask=0, p=0.5),
        A.BBoxSafeRandomCrop(),
        A.HorizontalFlip(p=0.5), A.Resize(*size, area_for_downscale=_area(antialias)),
        A.ToFloat(max_value=255.0), ToTensorV2(),
    ], bbox_params=_bbox_params())


def albu_crop_flip(crop: int, *, boxes: bool, antialias: bool = False) -> Any:
    """RandomResizedCrop((crop, crop)), HorizontalFlip, ToFloat, ToTensorV2; with ``boxes``,
    boxes and masks (``inst_seg``), else one mask (``sem_seg``)."""
    import albumentations as A
    from albumentations.pytorch import ToTensorV2

    ops = [A.RandomResizedCrop((crop, crop), area_for_downscale=_area(antialias)), A.HorizontalFlip(p=0.5),
           A.ToFloat(max_value=255.0), ToTensorV2()]
    return A.Compose(ops, bbox_params=_bbox_params()) if boxes else A.Compose(ops)


def albu_seg_preset(base: int, crop: int, mean_std: tuple[Sequence[float], Sequence[float]], *,
                    antialias: bool = False) -> Any:
    """The segmentation references' preset, equivalent not identical: SmallestMaxSize to a
    shorter side drawn from ``base // 2`` to ``2 * base - 1`` (RandomResize), HorizontalFlip,
    PadIfNeeded to ``crop`` x ``crop`` at the bottom right (fill 0, mask 255), RandomCrop,
    Normalize (``mean_std`` on the 0-1 scale), ToTensorV2."""
    import albumentations as A
    import cv2
    from albumentations.pytorch import ToTensorV2

    mean, std = mean_std
    return A.Compose([
        A.SmallestMaxSize(max_size=list(range(base // 2, 2 * base)), area_for_downscale=_area(antialias)),
        A.HorizontalFlip(p=0.5),
        A.PadIfNeeded(min_height=crop, min_width=crop, position="top_left",
                      border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=255),
        A.RandomCrop(crop, crop), A.Normalize(mean=mean, std=std), ToTensorV2(),
    ])


def cv2_one_thread(worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` of the Albumentations loaders: cv2 single-threaded."""
    import cv2

    cv2.setNumThreads(0)


def read_rgb(path: str) -> np.ndarray:
    """An image file as an (H, W, 3) uint8 RGB array, read with cv2."""
    import cv2

    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise OSError(f"cv2 could not read {path}")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


class AlbuCoco(torch.utils.data.Dataset):
    """COCO images read with cv2, their objects (XYXY boxes, category ids, and with ``masks``
    the objects' masks from pycocotools' ``annToMask``) through an Albumentations pipeline;
    returns (image, {"boxes", "labels", and "masks" with ``masks``, else "image_id"})."""

    def __init__(self, data: CocoData, transform: Any, masks: bool) -> None:
        from pycocotools.coco import COCO

        self.coco = COCO(str(data.ann_file))
        self.ids = sorted(self.coco.imgs)
        self.root, self.transform, self.masks = data.root, transform, masks

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Any]]:
        image_id = self.ids[index]
        anns = self.coco.loadAnns(self.coco.getAnnIds(imgIds=image_id))
        image = read_rgb(str(self.root / self.coco.imgs[image_id]["file_name"]))
        boxes = [[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)]
        args: dict[str, Any] = dict(image=image, bboxes=np.asarray(boxes, np.float32).reshape(-1, 4),
                                    labels=[a["category_id"] for a in anns], ids=list(range(len(anns))))
        if self.masks:
            args["masks"] = [self.coco.annToMask(a) for a in anns]
        out = self.transform(**args)
        target = {"boxes": torch.as_tensor(np.asarray(out["bboxes"], np.float32).reshape(-1, 4)),
                  "labels": torch.as_tensor(out["labels"], dtype=torch.int64)}
        if not self.masks:  # det_ssd's target keys: boxes, labels, image_id
            target["image_id"] = image_id
        else:  # the masks of the boxes kept
            kept = [int(i) for i in out["ids"]]
            target["masks"] = (torch.stack([torch.as_tensor(out["masks"][i]) for i in kept]) if kept
                               else torch.zeros((0, *out["image"].shape[-2:]), dtype=torch.uint8))
        return out["image"], target


class AlbuSegmentation(torch.utils.data.Dataset):
    """(image, mask) pairs: the image read with cv2, the palette mask's indices with PIL,
    through an Albumentations pipeline; returns (image, mask (1, H, W) uint8, or ``mask_dtype``)."""

    def __init__(self, data: SegmentationData, transform: Any, mask_dtype: torch.dtype = torch.uint8) -> None:
        self.images, self.masks, self.transform = data.images, data.masks, transform
        self.mask_dtype = mask_dtype

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from PIL import Image

        mask = np.asarray(Image.open(self.masks[index]))
        out = self.transform(image=read_rgb(self.images[index]), mask=mask)
        # (1, H, W), as the Mask of detection.SegmentationPairs
        return out["image"], torch.as_tensor(out["mask"][None]).to(self.mask_dtype)


def resampling_gap(paths: Sequence[str], crop: int, *, seed: int = 0) -> dict[str, float]:
    """How far Albumentations' resampling is from torchvision's: for one random box per image
    (a side 30-100% of the image's), the mean absolute difference (levels, averaged over the
    images) of cv2's bilinear resize (``"linear"``: Albumentations' default) and of its
    ``INTER_AREA`` where either side shrinks (``"area"``: ``area_for_downscale="image"``, which
    keeps bilinear for an enlargement) of the box to ``crop`` x ``crop``, from torchvision's
    ``resized_crop(..., antialias=True)`` of the same box."""
    import cv2
    import torchvision.transforms.v2.functional as F

    rng = np.random.default_rng(seed)
    gaps: dict[str, list[float]] = {"linear": [], "area": []}
    for path in paths:
        image = read_rgb(str(path))
        height, width = image.shape[:2]
        side = np.sqrt(rng.uniform(0.09, 1.0))
        h, w = int(height * side), int(width * side)
        y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        chw = torch.from_numpy(image).permute(2, 0, 1).contiguous()
        ref = F.resized_crop(chw, y, x, h, w, [crop, crop], antialias=True).permute(1, 2, 0).numpy()
        area = cv2.INTER_AREA if max(h, w) > crop else cv2.INTER_LINEAR
        for name, mode in (("linear", cv2.INTER_LINEAR), ("area", area)):
            out = cv2.resize(image[y:y + h, x:x + w], (crop, crop), interpolation=mode)
            gaps[name].append(float(np.abs(out.astype(np.int16) - ref).mean()))
    return {name: float(np.mean(values)) for name, values in gaps.items()}
