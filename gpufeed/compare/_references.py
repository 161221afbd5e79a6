"""The reference pipelines of the image benchmark: torchvision's ImageFolder indexing with the
same crop geometry as gpufeed's transforms, written with PIL and with OpenCV, for a plain
``torch.utils.data.DataLoader``."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import Dataset

from gpufeed.image._transforms import ImageTransform, RandomResizedCrop, ResizeCenterCrop
from gpufeed.sources import ImageFolder


class _ReferenceFolder(Dataset):
    """An image folder indexed as gpufeed's (= torchvision's) ImageFolder, whose geometry is
    given by a gpufeed transform; subclasses load and transform one image.

    Args:
        root: ``root/CLASS/IMAGE`` folder.
        transform: a :class:`ResizeCenterCrop` (eval) or :class:`RandomResizedCrop` (train),
            read for its sizes and crop parameters only.
        seed: seed of the random crops (as FastLoader's ``seed``).
    """

    def __init__(self, root: str | os.PathLike, transform: ImageTransform, seed: int = 0) -> None:
        if not isinstance(transform, (ResizeCenterCrop, RandomResizedCrop)):
            raise TypeError(f"`transform` must be a ResizeCenterCrop or RandomResizedCrop. "
                            f"Found: {type(transform).__name__}.")
        folder = ImageFolder(root)
        self.root = folder.root
        self.classes = folder.classes
        self.samples = folder.samples
        self.transform = transform
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[index]
        return self._load(index, path), target

    def _load(self, index: int, path: str) -> torch.Tensor:
        raise NotImplementedError

    def _train_box(self, crop: RandomResizedCrop, index: int, height: int,
                   width: int) -> tuple[int, int, int, int, bool]:
        """(top, left, height, width, flip) of sample ``index``: gpufeed's params, epoch 0."""
        p = crop.params(self.seed, 0, index, height, width)
        return p.top, p.left, p.height, p.width, p.flip


class PILImageFolder(_ReferenceFolder):
    """torchvision's ImageFolder + transforms, written with PIL: (uint8 CHW tensor, label)."""

    def _load(self, index: int, path: str) -> torch.Tensor:
        from PIL import Image

        with open(path, "rb") as f:  # torchvision's pil_loader
            img = Image.open(f).convert("RGB")
        oh, ow = self.transform.output_size
        if isinstance(self.transform, ResizeCenterCrop):
            nh, nw = self.transform.resized_size(img.height, img.width)
            img = img.resize((nw, nh), Image.Resampling.BILINEAR, reducing_gap=None)
            top, left = int(round((nh - oh) / 2.0)), int(round((nw - ow) / 2.0))
            img = img.crop((left, top, left + ow, top + oh))
        else:
            top, left, h, w, flip = self._train_box(self.transform, index, img.height, img.width)
            img = img.crop((left, top, left + w, top + h))
            img = img.resize((ow, oh), Image.Resampling.BILINEAR, reducing_gap=None)
            if flip:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1)  # pil_to_tensor


def _cv2_interpolation(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> int:
    import cv2

    (sh, sw), (dh, dw) = src_hw, dst_hw
    shrink2x = sh >= dh and sw >= dw and (sh >= 2 * dh or sw >= 2 * dw)
    return cv2.INTER_AREA if shrink2x else cv2.INTER_LINEAR


class OpenCVImageFolder(_ReferenceFolder):
    """The same pipeline with OpenCV (imdecode, resize, crop, flip): (uint8 CHW tensor, label)."""

    def _load(self, index: int, path: str) -> torch.Tensor:
        import cv2

        with open(path, "rb") as f:
            data = np.frombuffer(f.read(), np.uint8)
        img = cv2.imdecode(data, cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError(f"OpenCV cannot decode {path!r}")
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        oh, ow = self.transform.output_size
        height, width = img.shape[:2]
        if isinstance(self.transform, ResizeCenterCrop):
            nh, nw = self.transform.resized_size(height, width)
            img = cv2.resize(img, (nw, nh), interpolation=_cv2_interpolation((height, width), (nh, nw)))
            top, left = int(round((nh - oh) / 2.0)), int(round((nw - ow) / 2.0))
            img = img[top:top + oh, left:left + ow]
        else:
            top, left, h, w, flip = self._train_box(self.transform, index, height, width)
            region = img[top:top + h, left:left + w]
            img = cv2.resize(region, (ow, oh), interpolation=_cv2_interpolation((h, w), (oh, ow)))
            if flip:
                img = cv2.flip(img, 1)
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)
