"""Declarative image transforms (public names; the code is in ``gpufeed._image.transforms``)."""

from gpufeed._image.transforms import (
    CropParams,
    ImageTransform,
    RandomResizedCrop,
    ResizeCenterCrop,
    Size,
    stored_orientation,
)

__all__ = [
    "CropParams",
    "ImageTransform",
    "RandomResizedCrop",
    "ResizeCenterCrop",
    "Size",
    "stored_orientation",
]
