"""Re-creations of the detection and segmentation presets of torchvision's references
(``references/detection/presets.py`` and ``transforms.py``, ``references/segmentation/presets.py``
and ``v2_extras.py``: script folders, not a package), v2 only (``use_v2=True``): same class
names, op sequences, defaults and attributes, built from real torchvision ops; the helpers
``FixedSizeCrop`` and ``PadIfSmaller`` written anew with the same behaviour. The translation
tests (``tests/torchvision/test_detection_translate.py``) and the ``seg_preset`` recipe of
``benchmarks/detection.py`` use them."""

from __future__ import annotations

from collections import defaultdict

import torch
import torchvision.transforms.functional as F1
import torchvision.transforms.v2 as T
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

COCO_MEAN = (123.0, 117.0, 104.0)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _backend_first(backend: str) -> list:
    backend = backend.lower()
    if backend == "tv_tensor":
        return [T.ToImage()]
    if backend == "tensor":
        return [T.PILToTensor()]
    if backend != "pil":
        raise ValueError(f"backend can be 'tv_tensor', 'tensor' or 'pil', but got {backend}")
    return []


class FixedSizeCrop(torch.nn.Module):
    """references/detection/transforms.py: crop (random offset, one draw for both axes) to at
    most ``size``, then pad right/bottom to ``size`` with ``fill`` (v1 functional ops: a
    tuple ``fill`` works on PIL images only). Target: a dict with "boxes", "labels" and
    optionally "masks"; boxes clamped to the crop, empty ones dropped."""

    def __init__(self, size, fill=0, padding_mode="constant"):
        super().__init__()
        size = (size, size) if isinstance(size, int) else tuple(size)
        self.crop_height, self.crop_width = size
        self.fill = fill
        self.padding_mode = padding_mode

    def _pad(self, image, target, padding):
        left, top, right, bottom = padding
        image = F1.pad(image, [left, top, right, bottom], self.fill, self.padding_mode)
        if target is not None:
            target["boxes"][:, 0::2] += left
            target["boxes"][:, 1::2] += top
            if "masks" in target:
                target["masks"] = F1.pad(target["masks"], [left, top, right, bottom], 0, "constant")
        return image, target

    def _crop(self, image, target, top, left, height, width):
        image = F1.crop(image, top, left, height, width)
        if target is not None:
            boxes = target["boxes"]
            boxes[:, 0::2] -= left
            boxes[:, 1::2] -= top
            boxes[:, 0::2].clamp_(min=0, max=width)
            boxes[:, 1::2].clamp_(min=0, max=height)
            is_valid = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
            target["boxes"] = boxes[is_valid]
            target["labels"] = target["labels"][is_valid]
            if "masks" in target:
                target["masks"] = F1.crop(target["masks"][is_valid], top, left, height, width)
        return image, target

    def forward(self, img, target=None):
        _, height, width = F1.get_dimensions(img)
        new_height, new_width = min(height, self.crop_height), min(width, self.crop_width)
        image = img
        if new_height != height or new_width != width:
            offset_height = max(height - self.crop_height, 0)
            offset_width = max(width - self.crop_width, 0)
            r = torch.rand(1)
            top, left = int(offset_height * r), int(offset_width * r)
            image, target = self._crop(image, target, top, left, new_height, new_width)
        pad_bottom = max(self.crop_height - new_height, 0)
        pad_right = max(self.crop_width - new_width, 0)
        if pad_bottom != 0 or pad_right != 0:
            image, target = self._pad(image, target, [0, 0, pad_right, pad_bottom])
        return image, target


class DetectionPresetTrain:
    """The detection training preset (v2): backend conversion, the ``data_augmentation``
    policy, ToImage (pil backend), ToDtype(float, scale), ConvertBoundingBoxFormat(XYXY),
    SanitizeBoundingBoxes, ToPureTensor."""

    def __init__(self, *, data_augmentation, hflip_prob=0.5, mean=COCO_MEAN, backend="pil",
                 use_v2=True):
        if not use_v2:
            raise ValueError("only the v2 presets are re-created here")
        ops = _backend_first(backend)
        if data_augmentation == "hflip":
            ops += [T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "lsj":
            ops += [T.ScaleJitter(target_size=(1024, 1024), antialias=True),
                    FixedSizeCrop(size=(1024, 1024), fill=mean),
                    T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "multiscale":
            ops += [T.RandomShortestSize(min_size=(480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800),
                                         max_size=1333),
                    T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "ssd":
            fill = defaultdict(lambda: mean, {tv_tensors.Mask: 0})
            ops += [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=fill), T.RandomIoUCrop(),
                    T.RandomHorizontalFlip(p=hflip_prob)]
        elif data_augmentation == "ssdlite":
            ops += [T.RandomIoUCrop(), T.RandomHorizontalFlip(p=hflip_prob)]
        else:
            raise ValueError(f'Unknown data augmentation policy "{data_augmentation}"')
        if backend.lower() == "pil":
            ops += [T.ToImage()]
        ops += [T.ToDtype(torch.float, scale=True),
                T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
                T.SanitizeBoundingBoxes(), T.ToPureTensor()]
        self.transforms = T.Compose(ops)

    def __call__(self, img, target):
        return self.transforms(img, target)


class DetectionPresetEval:
    """The detection evaluation preset (v2): to tensor, ToDtype(float, scale), ToPureTensor."""

    def __init__(self, backend="pil", use_v2=True):
        backend = backend.lower()
        ops = [T.ToImage()] if backend == "pil" else _backend_first(backend)
        ops += [T.ToDtype(torch.float, scale=True), T.ToPureTensor()]
        self.transforms = T.Compose(ops)

    def __call__(self, img, target):
        return self.transforms(img, target)


class PadIfSmaller(T.Transform):
    """references/segmentation/v2_extras.py: pad right/bottom to at least ``size`` x ``size``,
    with the fill of each input's type."""

    def __init__(self, size, fill=0):
        super().__init__()
        self.size = size
        self.fill = T._utils._setup_fill_arg(fill)

    def make_params(self, flat_inputs):
        _, height, width = T._utils.query_chw(flat_inputs)
        padding = [0, 0, max(self.size - width, 0), max(self.size - height, 0)]
        return dict(padding=padding, needs_padding=any(padding))

    def transform(self, inpt, params):
        if not params["needs_padding"]:
            return inpt
        fill = T._utils._convert_fill_arg(T._utils._get_fill(self.fill, type(inpt)))
        return F.pad(inpt, padding=params["padding"], fill=fill)


class SegmentationPresetTrain:
    """The segmentation training preset (v2): RandomResize(0.5-2 x base), flip, PadIfSmaller,
    RandomCrop, to tensor, ToDtype per type (image float, mask int64), Normalize, ToPureTensor."""

    def __init__(self, *, base_size, crop_size, hflip_prob=0.5, mean=IMAGENET[0], std=IMAGENET[1],
                 backend="pil", use_v2=True):
        ops = _backend_first(backend)
        ops += [T.RandomResize(min_size=int(0.5 * base_size), max_size=int(2.0 * base_size))]
        if hflip_prob > 0:
            ops += [T.RandomHorizontalFlip(hflip_prob)]
        ops += [PadIfSmaller(crop_size, fill={tv_tensors.Mask: 255, "others": 0}),
                T.RandomCrop(crop_size)]
        if backend.lower() == "pil":
            ops += [T.PILToTensor()]
        img_type = tv_tensors.Image if backend.lower() == "tv_tensor" else torch.Tensor
        ops += [T.ToDtype(dtype={img_type: torch.float32, tv_tensors.Mask: torch.int64, "others": None},
                          scale=True),
                T.Normalize(mean=mean, std=std), T.ToPureTensor()]
        self.transforms = T.Compose(ops)

    def __call__(self, img, target):
        return self.transforms(img, target)


class SegmentationPresetEval:
    """The segmentation evaluation preset (v2): Resize((base, base)), to tensor,
    ToDtype(float, scale), Normalize, ToPureTensor."""

    def __init__(self, *, base_size, mean=IMAGENET[0], std=IMAGENET[1], backend="pil", use_v2=True):
        ops = [] if backend.lower() == "pil" else _backend_first(backend)
        ops += [T.Resize(size=(base_size, base_size))]
        if backend.lower() == "pil":
            ops += [T.PILToTensor()]
        ops += [T.ToDtype(torch.float, scale=True), T.Normalize(mean=mean, std=std), T.ToPureTensor()]
        self.transforms = T.Compose(ops)

    def __call__(self, img, target):
        return self.transforms(img, target)
