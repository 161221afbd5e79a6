"""``SegmentationDataset``: image + mask-file pairs (PASCAL VOC, Cityscapes style) on gpufeed's
detection path, returning what torchvision's ``VOCSegmentation`` wrapped by
``wrap_dataset_for_transforms_v2`` returns."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.decoders._header import Buffer
from gpufeed.errors import SKIP_HINT, DecodeError, shorten
from gpufeed.image.detection._sample import Mask
from gpufeed.sources._detection import DetectionSource
from gpufeed.sources._detection_items import (
    check_transform_args,
    open_pil,
    source_item,
    to_torchvision,
)
from gpufeed.sources._folder import IMG_EXTENSIONS
from gpufeed.sources._paths import PathTable
from gpufeed.sources._png import png_indices
from gpufeed.sources._read_options import DEFAULT_READ_BUDGET_BYTES

__all__ = ["SegmentationDataset"]


def _pairs_from_dirs(images: Path, masks: Path) -> tuple[list[str], list[str]]:
    """(image paths, mask paths) of the image files in ``images`` (sorted by name) and the files
    of ``masks`` with the same stem."""
    def files(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir()
                      if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)

    by_stem: dict[str, Path] = {}
    for p in files(masks):
        if p.stem in by_stem:
            raise ValueError(f"two masks share the stem {p.stem!r} in {masks}: "
                             f"{by_stem[p.stem].name} and {p.name}.")
        by_stem[p.stem] = p
    image_paths = files(images)
    if not image_paths:
        raise FileNotFoundError(f"no image files ({', '.join(IMG_EXTENSIONS)}) in {images}.")
    missing = [p for p in image_paths if p.stem not in by_stem]
    if missing:
        raise FileNotFoundError(f"{len(missing)} images have no mask of the same stem in {masks}, "
                                f"e.g. {missing[0]}.")
    return [os.fspath(p) for p in image_paths], [os.fspath(by_stem[p.stem]) for p in image_paths]


def mask_array(image: Any) -> np.ndarray:
    """A PIL mask as a (C, H, W) array of its stored values (palette indices for mode P), as
    torchvision's ``pil_to_tensor`` (hence ``tv_tensors.Mask(pil_image)``) reads it."""
    arr = np.array(image)
    if arr.ndim == 2:
        return arr[None]
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


class SegmentationDataset(DetectionSource):
    """Images and their segmentation masks: ``images`` and ``masks`` are equal-length lists of
    paths, or two directories whose files are matched by stem (``2007_000032.jpg`` with
    ``2007_000032.png``; images sorted by name).

    Without a gpufeed pipeline, sample ``i`` is (``PIL.Image.open(image).convert("RGB")``,
    ``tv_tensors.Mask`` of ``PIL.Image.open(mask)``): for a VOC palette PNG, (1, H, W) uint8
    class indices (255 on borders), as the wrapped ``VOCSegmentation``; a plain tensor without
    torchvision. With a :class:`~gpufeed.image.detection.DetectionPipeline` in ``transforms``
    the image is decoded by gpufeed and the mask (the same values) moves with it; any other
    callable takes (PIL image, mask). ``transform``/``target_transform``: callables on the image
    / the mask (not with ``transforms``). ``read_concurrency`` / ``read_budget_bytes``: reads in
    flight per worker, as for :class:`~gpufeed.sources.ImageSource`.
    """

    def __init__(self, images: str | os.PathLike | Sequence[str | os.PathLike],
                 masks: str | os.PathLike | Sequence[str | os.PathLike], transforms: Any = None,
                 *, transform: Any = None, target_transform: Any = None,
                 read_concurrency: int | None = None,
                 read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES) -> None:
        check_transform_args(transform, target_transform, transforms)
        self.set_read_options(read_concurrency, read_budget_bytes)
        if isinstance(images, (str, os.PathLike)) != isinstance(masks, (str, os.PathLike)):
            raise TypeError(f"`images` and `masks` must both be directories or both lists of "
                            f"paths. Found: {shorten(images)} and {shorten(masks)}.")
        if isinstance(images, (str, os.PathLike)):
            assert isinstance(masks, (str, os.PathLike))
            for name, folder in (("images", images), ("masks", masks)):
                if not Path(folder).is_dir():
                    raise NotADirectoryError(f"`{name}` must be a directory or a list of paths. "
                                             f"Found: {os.fspath(folder)!r}, not a directory.")
            image_list, mask_list = _pairs_from_dirs(Path(images), Path(masks))
        else:
            image_list = [os.fspath(p) for p in images]
            mask_list = [os.fspath(p) for p in masks]  # type: ignore[union-attr]
            if len(image_list) != len(mask_list):
                raise ValueError(f"`images` and `masks` must have the same length. "
                                 f"Found: {len(image_list)} and {len(mask_list)}.")
        self._images = PathTable(image_list)
        self._masks = PathTable(mask_list)
        self.transform = transform
        self.target_transform = target_transform
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self._images)

    @property
    def images(self) -> list[str]:
        """Image paths (torchvision's ``images``)."""
        return self._images.tolist()

    @property
    def masks(self) -> list[str]:
        """Mask paths (torchvision's ``masks``)."""
        return self._masks.tolist()

    def describe(self, index: int) -> str:
        return self._images[index]

    def read_item(self, index: int) -> tuple[Buffer, bytes]:
        """(image bytes, mask bytes)."""
        with open(self._images[index], "rb") as f:
            data = f.read()
        with open(self._masks[index], "rb") as f:
            return data, f.read()

    def target_of(self, index: int, record: Any, canvas: tuple[int, int]) -> Mask:
        """The mask (a dense (C, H, W) :class:`Mask`, C = 1 for palette or grayscale PNGs)
        decoded from ``record`` (its file's bytes); its size must be the image's ``canvas``.
        A mask that does not decode, or has another size, raises ``DecodeError`` (a
        ``ValueError``), which the loader's ``on_error="skip"`` leaves out as a bad image."""
        encoded = bytes(record)
        indices = png_indices(encoded)
        try:
            data = (indices[None] if indices is not None
                    else mask_array(open_pil(encoded, rgb=False)))
        except (OSError, SyntaxError, ValueError) as exc:
            raise DecodeError(f"cannot decode the mask {self._masks[index]} of sample index {index}: "
                              f"{exc}. Check or remove the pair, or pass {SKIP_HINT} to leave bad "
                              f"samples out of their batch.") from exc
        if tuple(data.shape[1:]) != tuple(canvas):
            raise DecodeError(f"the mask {self._masks[index]} of sample index {index} is "
                              f"{data.shape[2]}x{data.shape[1]} but its image {self._images[index]} "
                              f"is {canvas[1]}x{canvas[0]} (WxH): a mask must have its image's size. "
                              f"Fix or remove the pair, or pass {SKIP_HINT} to leave bad samples out "
                              f"of their batch.")
        return Mask(data=data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """(image, mask) of sample ``index``: see the class docstring."""
        return source_item(self, index, self._plain_item)

    def _plain_item(self, i: int) -> tuple[Any, Any]:
        image = open_pil(self._images[i])
        mask = open_pil(self._masks[i], rgb=False)
        return image, to_torchvision(Mask(data=mask_array(mask)))

    def __repr__(self) -> str:
        return f"SegmentationDataset({len(self)} pairs)"
