"""torchvision and timm transform pipelines, translated to gpufeed's image fast path.

``ImageFolder(root, transform=T.Compose([...]))`` (and ``ImageDataset``, ``LMDBDataset``)
recognises a torchvision pipeline (``torchvision.transforms`` or ``torchvision.transforms.v2``,
and timm's, e.g. ``timm.data.create_transform(224, is_training=True)``) by the classes and
parameters of its ops, and :func:`from_torchvision` does the same on request. Translated:

- ``Resize(int)`` + ``CenterCrop(size)`` -> :class:`~gpufeed.ResizeCenterCrop`; ``Resize((h, w))``
  -> ``gpufeed.transforms.Resize``;
- ``RandomResizedCrop(size, scale, ratio)`` (timm's ``RandomResizedCropAndInterpolation`` too)
  (+ ``RandomHorizontalFlip(p=0.5)``) -> :class:`~gpufeed.RandomResizedCrop` (crop box and flip
  drawn from (seed, epoch, index)); bilinear, bicubic, or timm's random choice of the two;
- ``ToTensor`` / ``PILToTensor`` / ``ToImage`` (timm's ``MaybeToTensor``) + ``ToDtype(float,
  scale=True)`` / ``ConvertImageDtype`` and ``Normalize`` -> the batch's ``dtype`` and
  ``normalize``, applied once per batch (on the GPU with ``FastLoader(device=...)``);
- augmentations gpufeed has (``gpufeed.augment``: flips with any ``p``, ``ColorJitter``,
  ``RandomGrayscale``, ``GaussianBlur``, the point ops, ``RandomRotation``, ``RandomAffine``,
  ``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment``, timm's ``rand-m*`` RandAugment and
  AutoAugment, torchvision's and timm's ``RandomErasing``, and ``RandomApply`` /
  ``RandomChoice`` / ``RandomOrder`` of these) -> that op with the same parameters, on the uint8
  rows in the workers (``RandomErasing``: on the normalized float rows);
- any other op that accepts tensors (a torchvision op, or a user's callable or
  ``torch.nn.Module`` placed after the conversion to tensor) -> run as given on each row as a
  (3, H, W) tensor after gpufeed's decode and crop, with torch's and Python's random generators
  seeded from (seed, epoch, index) (``gpufeed._image.tensor_ops``): it costs only itself.

Only an op that needs a PIL image (``Lambda`` or a user's callable before the conversion to
tensor, ``ToPILImage``), changes the image size after the crop, comes before the crop, or has
parameters gpufeed's resize does not take (another interpolation, ``max_size``,
``antialias=False`` on a tensor) leaves the pipeline as given: the workers call
it on PIL images (the generic path), and the dataset warns once (``GpufeedWarning``) naming the
op, the reason and what to use instead. :func:`explain` says where every op runs: ``fast``
(gpufeed's own path), ``tensor`` (as given, on the row), ``float`` (as given, on the
normalized row) or ``NO`` (needs the generic path).

Orientation: torchvision's ``ImageFolder`` opens files with PIL, which ignores the EXIF
orientation tag. A torchvision pipeline in a gpufeed dataset (translated, or run as given)
therefore sees the image as stored, as in torchvision; gpufeed's own transforms
(``ResizeCenterCrop``, ``RandomResizedCrop`` given directly) apply the orientation.

torchvision is never imported here: ops are recognised by their class's module name
(``torchvision.transforms...``) and attributes; ``ToImage`` outputs import
``torchvision.tv_tensors`` when ``dataset[i]`` wraps a result, i.e. only for a user's v2 object.

The code is in ``gpufeed._image.torchvision``; this module re-exports its public names.
"""

from gpufeed._image.torchvision import (
    OpRoute,
    TorchvisionPipeline,
    explain,
    from_torchvision,
    is_torchvision,
    translate_or_none,
)

__all__ = [
    "OpRoute",
    "TorchvisionPipeline",
    "explain",
    "from_torchvision",
    "is_torchvision",
    "translate_or_none",
]
