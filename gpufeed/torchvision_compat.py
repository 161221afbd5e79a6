"""torchvision transform pipelines, translated to gpufeed's image fast path.

``ImageFolder(root, transform=T.Compose([...]))`` (and ``ImageDataset``, ``LMDBDataset``)
recognises a torchvision pipeline (``torchvision.transforms`` or ``torchvision.transforms.v2``)
by the classes and parameters of its ops, and :func:`from_torchvision` does the same on request.
Translated, with the same geometry:

- ``Resize(int)`` + ``CenterCrop(size)`` -> :class:`~gpufeed.ResizeCenterCrop`;
- ``RandomResizedCrop(size, scale, ratio)`` (+ ``RandomHorizontalFlip(p=0.5)``) ->
  :class:`~gpufeed.RandomResizedCrop` (crop box and flip drawn from (seed, epoch, index));
- ``ToTensor`` / ``PILToTensor`` / ``ToImage`` + ``ToDtype(float, scale=True)`` /
  ``ConvertImageDtype`` and ``Normalize`` -> the batch's ``dtype`` and ``normalize``, applied
  once per batch (on the GPU with ``FastLoader(device=...)``).

Interpolation must be bilinear. Anything else (bicubic, a flip with ``p`` other than 0.5,
``Resize((h, w))``, ``max_size``, ``antialias=False`` on a tensor, an op gpufeed does not know)
leaves the pipeline as given: the workers call it on PIL images (the generic path).
:func:`explain` says which ops run where and why.

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
