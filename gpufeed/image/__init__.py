"""The image fast path: declarative transforms, augmentations, and the translation of
torchvision and timm pipelines to them.

Public names are documented here and in :mod:`gpufeed.image.augment`; the modules inside the
package (decode-and-resize, batch fill, normalize, resampling) are private.

Transforms
----------

Declarative image transforms that run in workers and write straight into a batch row.

A transform turns encoded bytes into a fixed-size RGB image in ``out``, a C-contiguous uint8
array of shape (H, W, 3) or (3, H, W) (a row of the shared batch buffer). It first computes the
crop box in source pixels from the header alone, then decodes at the smallest DCT scale that
keeps the crop at least as large as the output (JPEG only), then crops and resizes just that
region into ``out``.

Resampling (``interpolation``): torchvision resizes with antialiased bilinear filtering.
``"auto"`` (default) uses ``cv2.INTER_AREA`` (a box filter: antialiased) when the region shrinks
by 2x or more on an axis and ``cv2.INTER_LINEAR`` otherwise, including every upscale.
``"area"`` uses INTER_AREA for every shrink, ``"linear"`` INTER_LINEAR throughout. Why: INTER_AREA
at a fractional ratio costs 6-9x INTER_LINEAR (0.8-1.1 ms vs 0.13 ms to bring a 300x360 or
500x375 region to 224x224, one thread), about as much as decoding a 500x375 JPEG, while below
2x, where bilinear barely aliases, the two differ from the full-resolution reference by the same
amount (mean 2.4-2.8 vs 2.4-2.8 levels on our test images). After a DCT-scaled decode (factors
1/8, 1/4, 1/2, 1) the remaining shrink is always below 2x, so JPEGs take the fast path.
``"bicubic"`` (torchvision's ``BICUBIC``) is ``"auto"`` with INTER_CUBIC in place of
INTER_LINEAR; ``"random"`` (timm's ``RandomResizedCropAndInterpolation`` default) picks
``"auto"`` (bilinear) or ``"bicubic"`` per sample, with equal probability, from
(seed, epoch, index).

Two decode paths (the pixel work is in ``gpufeed.image._resample``). The RGB path decodes to RGB and
resizes once. The plane path decodes a JPEG to its Y (Cb, Cr) planes, skipping libjpeg's chroma
upsampling and colour conversion, resizes each plane straight to the output size (chroma lined
up with luma: ``_resample._chroma_span``) and converts YCbCr to RGB once, at the output size.
``apply`` takes it for greyscale and 4:4:0 JPEGs decoded by libjpeg-turbo in stored orientation
(4:4:0 at DCT factor 1 only). Measured on the demo images (~400x350, quality 90) re-encoded per
layout, 224x224 output, one thread, train and eval alike: greyscale 0.56 -> 0.44 ms/img, 4:4:0
0.88 -> 0.73 (libjpeg-turbo 2.1 upsamples 4:4:0 chroma without SIMD). 4:2:0 keeps the RGB path:
its plane decode saves 0.03-0.06 ms, but three plane resizes cost as much as one RGB resize
(0.09-0.10 ms) and merging and converting colour add 0.035 ms, leaving it within +-0.015 ms
of the RGB path (noise here). 4:2:2 and progressive 4:2:0 were 0.01-0.03 ms slower through
planes; 4:4:4 has no upsampling to skip. Colour at DCT factors below 1 keeps the RGB path too:
libjpeg-turbo then decodes chroma planes at half the scaled size, where the RGB decode
IDCT-scales chroma to full detail. Output: greyscale is identical on both paths; colour differs
from the RGB path by 0.4-0.9 levels on average (99th percentile 2-9) and is as close to the
unencoded image.

Randomness comes from (seed, epoch, sample index) only, hashed with SHAKE-128, so the same
sample gets the same crop in whatever process computes it, and a new crop every epoch.

Several views of one image: :class:`MultiView` (one pipeline per view, one decode per sample at
the scale the most demanding view needs; the batch's image part is a list of tensors, one per
view).

Augmentations (``ops``, ``float_ops``: :mod:`gpufeed.image.augment`) run after the geometry, on the
uint8 row, and after normalize, on the float row (docs/design/augment.md).

torchvision and timm pipelines
------------------------------

torchvision and timm transform pipelines, translated to gpufeed's image fast path.

``ImageFolder(root, transform=T.Compose([...]))`` (and ``ImageDataset``, ``LMDBDataset``)
recognises a torchvision pipeline (``torchvision.transforms`` or ``torchvision.transforms.v2``,
and timm's, e.g. ``timm.data.create_transform(224, is_training=True)``) by the classes and
parameters of its ops, and :func:`from_torchvision` does the same on request. Translated:

- ``Resize(int)`` + ``CenterCrop(size)`` -> :class:`~gpufeed.ResizeCenterCrop`; ``Resize((h, w))``
  -> ``gpufeed.image.Resize``;
- ``RandomResizedCrop(size, scale, ratio)`` (timm's ``RandomResizedCropAndInterpolation`` too)
  (+ ``RandomHorizontalFlip(p=0.5)``) -> :class:`~gpufeed.RandomResizedCrop` (crop box and flip
  drawn from (seed, epoch, index)); bilinear, bicubic, or timm's random choice of the two;
- ``ToTensor`` / ``PILToTensor`` / ``ToImage`` (timm's ``MaybeToTensor``) + ``ToDtype(float,
  scale=True)`` / ``ConvertImageDtype`` and ``Normalize`` -> the batch's ``dtype`` and
  ``normalize``, applied once per batch (on the GPU with ``FastLoader(device=...)``);
- augmentations gpufeed has (``gpufeed.image.augment``: flips with any ``p``, ``ColorJitter``,
  ``RandomGrayscale``, ``GaussianBlur``, the point ops, ``RandomRotation``, ``RandomAffine``,
  ``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment``, timm's ``rand-m*`` RandAugment and
  AutoAugment, torchvision's and timm's ``RandomErasing``, and ``RandomApply`` /
  ``RandomChoice`` / ``RandomOrder`` of these) -> that op with the same parameters, on the uint8
  rows in the workers (``RandomErasing``: on the normalized float rows);
- any other op that accepts tensors (a torchvision op, or a user's callable or
  ``torch.nn.Module`` placed after the conversion to tensor) -> run as given on each row as a
  (3, H, W) tensor after gpufeed's decode and crop, with torch's and Python's random generators
  seeded from (seed, epoch, index) (``gpufeed.image._tensor_ops``): it costs only itself;
- no-ops, left out: ``ToPureTensor`` after the conversion to tensor (batches are plain tensors),
  and open_clip's conversions of a PIL image to RGB before it (its ``_convert_to_rgb`` function,
  its ``MaybeConvertMode(mode="RGB")``), since gpufeed decodes every image to RGB.

The pipelines people copy are recognised by shape, not imported: the ``ClassificationPresetTrain``
/ ``ClassificationPresetEval`` classes of torchvision's classification references (a callable
whose ``.transforms`` is a torchvision pipeline) translate as that pipeline, op for op; open_clip's
``image_transform(...)`` is a torchvision ``Compose`` (with ``_convert_to_rgb``, or with
``MaybeConvertMode`` and ``MaybeToTensor``, a ``ToTensor`` subclass, recognised as ``ToTensor``).

Only an op that needs a PIL image (``Lambda`` or a user's callable before the conversion to
tensor, ``ToPILImage``), changes the image size after the crop, comes before the crop, or has
parameters gpufeed's resize does not take (another interpolation, ``max_size``,
``antialias=False`` on a tensor) leaves the pipeline as given: the workers call
it on PIL images (the generic path), and the dataset warns once (``GpufeedWarning``) naming the
op, the reason and what to use instead. :func:`explain_transform` (and ``gpufeed.explain``, which
also takes a loader or a dataset) says where every op runs: ``fast``
(gpufeed's own path), ``tensor`` (as given, on the row), ``float`` (as given, on the
normalized row) or ``NO`` (needs the generic path).

Orientation: torchvision's ``ImageFolder`` opens files with PIL, which ignores the EXIF
orientation tag. A torchvision pipeline in a gpufeed dataset (translated, or run as given)
therefore sees the image as stored, as in torchvision; gpufeed's own transforms
(``ResizeCenterCrop``, ``RandomResizedCrop`` given directly) apply the orientation.

torchvision is never imported here: ops are recognised by their class's module name
(``torchvision.transforms...``) and attributes; ``ToImage`` outputs import
``torchvision.tv_tensors`` when ``dataset[i]`` wraps a result, i.e. only for a user's v2 object.
"""

from gpufeed.image._torchvision import (
    OpRoute,
    TorchvisionPipeline,
    from_torchvision,
    is_torchvision,
    translate_or_none,
)
from gpufeed.image._transforms import (
    CropParams,
    ImageTransform,
    RandomResizedCrop,
    Resize,
    ResizeCenterCrop,
    Size,
    stored_orientation,
)
from gpufeed.image._views import MultiView, explain_transform

__all__ = [
    "CropParams",
    "ImageTransform",
    "MultiView",
    "OpRoute",
    "RandomResizedCrop",
    "Resize",
    "ResizeCenterCrop",
    "Size",
    "TorchvisionPipeline",
    "explain_transform",
    "from_torchvision",
    "is_torchvision",
    "stored_orientation",
    "translate_or_none",
]
