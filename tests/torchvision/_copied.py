"""Local re-creations of the pipelines people copy into their projects, which cannot be imported
here: the classification presets of torchvision's references (a script folder, not a package)
and open_clip's ``image_transform`` (open_clip is not installed). Same classes, names, op
sequences and defaults, built from real torchvision ops."""

from __future__ import annotations

import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
from torchvision.transforms import InterpolationMode

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
OPENAI = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


def _ops(use_v2: bool):
    return T2 if use_v2 else T1


class ClassificationPresetTrain:
    """The training preset: RandomResizedCrop, flip, an optional auto-augment policy, uint8
    tensor, float, Normalize, optional RandomErasing (v2: then ToPureTensor)."""

    def __init__(self, *, crop_size, mean=IMAGENET[0], std=IMAGENET[1],
                 interpolation=InterpolationMode.BILINEAR, hflip_prob=0.5, auto_augment_policy=None,
                 ra_magnitude=9, augmix_severity=3, random_erase_prob=0.0, backend="pil",
                 use_v2=False):
        T = _ops(use_v2)
        ops = []
        if backend == "tensor":
            ops.append(T.PILToTensor())
        elif backend != "pil":
            raise ValueError(f"backend can be 'tensor' or 'pil', got {backend}")
        ops.append(T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True))
        if hflip_prob > 0:
            ops.append(T.RandomHorizontalFlip(hflip_prob))
        if auto_augment_policy == "ra":
            ops.append(T.RandAugment(interpolation=interpolation, magnitude=ra_magnitude))
        elif auto_augment_policy == "ta_wide":
            ops.append(T.TrivialAugmentWide(interpolation=interpolation))
        elif auto_augment_policy == "augmix":
            ops.append(T.AugMix(interpolation=interpolation, severity=augmix_severity))
        elif auto_augment_policy is not None:
            ops.append(T.AutoAugment(policy=T.AutoAugmentPolicy(auto_augment_policy),
                                     interpolation=interpolation))
        if backend == "pil":
            ops.append(T.PILToTensor())
        ops.append(T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float))
        ops.append(T.Normalize(mean=mean, std=std))
        if random_erase_prob > 0:
            ops.append(T.RandomErasing(p=random_erase_prob))
        if use_v2:
            ops.append(T.ToPureTensor())
        self.transforms = T.Compose(ops)

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    """The evaluation preset: Resize, CenterCrop, uint8 tensor, float, Normalize (v2: then
    ToPureTensor)."""

    def __init__(self, *, crop_size, resize_size=256, mean=IMAGENET[0], std=IMAGENET[1],
                 interpolation=InterpolationMode.BILINEAR, backend="pil", use_v2=False):
        T = _ops(use_v2)
        ops = []
        if backend == "tensor":
            ops.append(T.PILToTensor())
        elif backend != "pil":
            raise ValueError(f"backend can be 'tensor' or 'pil', got {backend}")
        ops += [T.Resize(resize_size, interpolation=interpolation, antialias=True),
                T.CenterCrop(crop_size)]
        if backend == "pil":
            ops.append(T.PILToTensor())
        ops += [T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float),
                T.Normalize(mean=mean, std=std)]
        if use_v2:
            ops.append(T.ToPureTensor())
        self.transforms = T.Compose(ops)

    def __call__(self, img):
        return self.transforms(img)


def _convert_to_rgb(image):
    """open_clip's conversion of a PIL image to RGB (a no-op on an RGB image)."""
    return image.convert("RGB")


def image_transform(image_size, is_train, mean=OPENAI[0], std=OPENAI[1]):
    """open_clip's ``image_transform`` (default resize mode, no extra augmentation): a v1
    ``Compose`` with ``_convert_to_rgb`` before ``ToTensor``, bicubic resampling."""
    normalize = T1.Normalize(mean=mean, std=std)
    if is_train:
        return T1.Compose([
            T1.RandomResizedCrop(image_size, scale=(0.9, 1.0), interpolation=InterpolationMode.BICUBIC),
            _convert_to_rgb,
            T1.ToTensor(),
            normalize,
        ])
    return T1.Compose([
        T1.Resize(image_size, interpolation=InterpolationMode.BICUBIC),
        T1.CenterCrop(image_size),
        _convert_to_rgb,
        T1.ToTensor(),
        normalize,
    ])


class MaybeConvertMode:
    """open_clip's later form of ``_convert_to_rgb``: ``convert(mode)`` on PIL images only."""

    def __init__(self, mode="RGB"):
        self.mode = mode

    def __call__(self, pic):
        if isinstance(pic, torch.Tensor):
            return pic
        return pic.convert(self.mode)

    def __repr__(self):
        return f"{type(self).__name__}()"


class MaybeToTensor(T1.ToTensor):
    """open_clip's ``ToTensor`` that passes tensors through."""

    def __call__(self, pic):
        if isinstance(pic, torch.Tensor):
            return pic
        return super().__call__(pic)

    def __repr__(self):
        return f"{type(self).__name__}()"


def image_transform_later(image_size, is_train, mean=OPENAI[0], std=OPENAI[1]):
    """open_clip's later ``image_transform``: ``MaybeConvertMode`` and ``MaybeToTensor`` in place of
    ``_convert_to_rgb`` and ``ToTensor``."""
    head = ([T1.RandomResizedCrop(image_size, scale=(0.9, 1.0), interpolation=InterpolationMode.BICUBIC)]
            if is_train else
            [T1.Resize(image_size, interpolation=InterpolationMode.BICUBIC), T1.CenterCrop(image_size)])
    return T1.Compose(head + [MaybeConvertMode(), MaybeToTensor(), T1.Normalize(mean=mean, std=std)])
