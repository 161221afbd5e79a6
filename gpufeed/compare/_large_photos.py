"""Large photos (phone/COCO sizes, 2-6 MB JPEGs): FastLoader against the DataLoader pipelines
that decode at a reduced DCT scale too, in alternating rounds.

Four loaders, each yielding uint8 ``[N, 3, H, W]`` batches with the geometry of
:mod:`gpufeed.compare._images` (eval: Resize(256)+CenterCrop(224); train: RandomResizedCrop(224)+flip,
gpufeed's crop boxes):

``DataLoader+PIL``
    :class:`~gpufeed.compare._references.PILImageFolder`: full-size decode, then resize.
``DataLoader+PIL draft``
    :class:`PILDraftImageFolder`: ``Image.draft("RGB", size)`` first, with ``size`` the smallest
    that keeps the crop at least as large as the output (PIL then decodes at 1/2, 1/4 or 1/8),
    and a resize of the crop box scaled to the drafted image (``Image.resize(box=...)``).
``DataLoader+OpenCV reduced``
    :class:`OpenCVReducedImageFolder`: ``cv2.imdecode`` with ``IMREAD_REDUCED_COLOR_{2,4,8}``,
    the largest reduction that keeps the crop at least as large as the output (sizes from the
    JPEG header), then the scaled crop, ``cv2.resize`` (INTER_AREA for shrinks of 2x or more,
    else INTER_LINEAR) and ``cv2.flip``.
``FastLoader``
    ``FastLoader(ImageFolder(root, transform=...))`` (DCT-scaled decode by libjpeg-turbo).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from gpufeed.compare._compare import CompareResult, LoaderFactory, compare
from gpufeed.compare._images import (
    FAST_NAME,
    PIL_NAME,
    _ignore_sigint,
    image_environment,
    loader_factories,
    make_transform,
    single_threaded_cv2,
)
from gpufeed.compare._references import _cv2_interpolation, _ReferenceFolder
from gpufeed.decoders import read_header
from gpufeed.errors import shorten
from gpufeed.image._transforms import ImageTransform, ResizeCenterCrop
from gpufeed.sources import ImageFolder

__all__ = ["CV_REDUCED_NAME", "PIL_DRAFT_NAME", "OpenCVReducedImageFolder", "PILDraftImageFolder",
           "large_photo_factories", "needed_scale", "run_large_photo_bench"]

PIL_DRAFT_NAME = "DataLoader+PIL draft"
CV_REDUCED_NAME = "DataLoader+OpenCV reduced"


def needed_scale(transform: ImageTransform, box: tuple[float, float, float, float]) -> float:
    """The smallest scale of the full-size image (``<= 1``) at which the crop ``box`` (top, left,
    height, width in full-size pixels) is still at least the output size."""
    oh, ow = transform.output_size
    return min(1.0, max(oh / box[2], ow / box[3]))


class _ScaledReference(_ReferenceFolder):
    """The crop box (and flip) of sample ``index`` in full-size pixels, as gpufeed computes it."""

    def _box(self, index: int, height: int, width: int) -> tuple[tuple[float, float, float, float], bool]:
        if isinstance(self.transform, ResizeCenterCrop):
            return self.transform.source_box(height, width), False
        top, left, h, w, flip = self._train_box(self.transform, index, height, width)
        return (top, left, h, w), flip


class PILDraftImageFolder(_ScaledReference):
    """PIL with ``Image.draft``: the JPEG decoded at the largest DCT reduction whose output keeps
    the crop at least as large as the output, then the crop box resized (bilinear, PIL's
    antialiasing) and flipped: (uint8 CHW tensor, label)."""

    def _load(self, index: int, path: str) -> torch.Tensor:
        from PIL import Image

        with open(path, "rb") as f:
            encoded = Image.open(f)
            width, height = encoded.size
            box, flip = self._box(index, height, width)
            scale = needed_scale(self.transform, box)
            if scale < 1.0:
                encoded.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
            img = encoded.convert("RGB")
        sx, sy = img.width / width, img.height / height
        top, left, bh, bw = box
        oh, ow = self.transform.output_size
        img = img.resize((ow, oh), Image.Resampling.BILINEAR, reducing_gap=None,
                         box=(left * sx, top * sy, (left + bw) * sx, (top + bh) * sy))
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1)


class OpenCVReducedImageFolder(_ScaledReference):
    """OpenCV with ``IMREAD_REDUCED_COLOR_{2,4,8}``: the largest reduction that keeps the crop at
    least as large as the output (image size from the JPEG header), then crop, ``cv2.resize``
    and flip: (uint8 CHW tensor, label)."""

    def _load(self, index: int, path: str) -> torch.Tensor:
        import cv2

        with open(path, "rb") as f:
            data = np.frombuffer(f.read(), np.uint8)
        header = read_header(data)
        height, width = header.height, header.width
        box, flip = self._box(index, height, width)
        scale = needed_scale(self.transform, box)
        flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                 8: cv2.IMREAD_REDUCED_COLOR_8}
        reduction = 1
        if header.fmt == "jpeg":
            for r in (8, 4, 2):
                if -(-height // r) >= height * scale and -(-width // r) >= width * scale:
                    reduction = r
                    break
        img = cv2.imdecode(data, flags[reduction])
        if img is None:
            raise ValueError(f"OpenCV cannot decode {path!r}")
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        sy, sx = img.shape[0] / height, img.shape[1] / width
        top, left, bh, bw = box
        y0, x0 = int(round(top * sy)), int(round(left * sx))
        y1 = max(y0 + 1, int(round((top + bh) * sy)))
        x1 = max(x0 + 1, int(round((left + bw) * sx)))
        region = img[y0:y1, x0:x1]
        oh, ow = self.transform.output_size
        img = cv2.resize(region, (ow, oh), interpolation=_cv2_interpolation(region.shape[:2], (oh, ow)))
        if flip:
            img = cv2.flip(img, 1)
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)


def large_photo_factories(root: str | os.PathLike, transform: str = "eval", *, batch_size: int = 16,
                          num_workers: int = 2, seed: int = 0) -> dict[str, LoaderFactory]:
    """name -> loader factory for the four pipelines of the module docstring (same batch size,
    workers, sampling and geometry as :func:`gpufeed.compare._images.loader_factories`)."""
    base = loader_factories(root, transform, batch_size=batch_size, num_workers=num_workers,
                            seed=seed, include=[PIL_NAME, FAST_NAME])
    geometry = make_transform(transform)
    shuffle = transform == "train"

    def reference(ds: _ReferenceFolder) -> LoaderFactory:
        return lambda: DataLoader(ds, batch_size=batch_size, num_workers=num_workers, shuffle=shuffle,
                                  generator=torch.Generator().manual_seed(seed),
                                  worker_init_fn=_ignore_sigint)

    return {PIL_NAME: base[PIL_NAME],
            PIL_DRAFT_NAME: reference(PILDraftImageFolder(root, geometry, seed=seed)),
            CV_REDUCED_NAME: reference(OpenCVReducedImageFolder(root, geometry, seed=seed)),
            FAST_NAME: base[FAST_NAME]}


def run_large_photo_bench(root: str | os.PathLike, transform: str = "eval", *, num_workers: int = 2,
                          batch_size: int = 16, num_batches: int | None = None, num_rounds: int = 3,
                          num_warmup_rounds: int = 1, seed: int = 0) -> CompareResult:
    """The four pipelines on ``root`` in alternating rounds (baseline DataLoader+PIL).
    ``num_batches``: per round (default: the full batches of one epoch)."""
    if transform not in ("eval", "train"):
        raise ValueError(f"`transform` must be 'eval' or 'train'. Found: {shorten(transform)}.")
    full = len(ImageFolder(root)) // batch_size
    if num_batches is None:
        num_batches = full
    if not 2 <= num_batches <= full:
        raise ValueError(f"need 2 to {full} full batches of {batch_size} per round. "
                         f"Found: {num_batches}. Fix: lower batch_size or add images.")
    factories = large_photo_factories(root, transform, batch_size=batch_size,
                                      num_workers=num_workers, seed=seed)
    env: dict[str, Any] = image_environment(num_workers)
    with single_threaded_cv2():
        result = compare(factories, num_batches=num_batches, num_rounds=num_rounds,
                         num_warmup_rounds=num_warmup_rounds, baseline=PIL_NAME, environment=env)
    return result
