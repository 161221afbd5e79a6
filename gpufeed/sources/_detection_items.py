"""``__getitem__`` of the detection sources: a gpufeed :class:`DetectionPipeline` on the image
decoded by gpufeed, or torchvision's sample (PIL image, target of ``tv_tensors``) handed to a
callable, as ``wrap_dataset_for_transforms_v2`` returns it."""

from __future__ import annotations

import importlib
import io
import operator
import os
from collections.abc import Callable
from typing import Any

from gpufeed.decoders._header import Buffer
from gpufeed.errors import DecodeError, add_note
from gpufeed.image.detection._as_given import torch_leaf
from gpufeed.image.detection._pipeline import DetectionPipeline
from gpufeed.image.detection._sample import map_leaves, sample_rng
from gpufeed.image.detection._source_rows import (
    decode_source,
    is_decode_failure,
    source_sample,
    source_size,
)

__all__ = ["check_transform_args", "finish_item", "open_pil", "pipeline_item", "source_item",
           "to_torchvision"]


def check_transform_args(transform: Any, target_transform: Any, transforms: Any) -> None:
    """torchvision's rule: ``transforms`` or ``transform``/``target_transform``, not both."""
    if transforms is not None and (transform is not None or target_transform is not None):
        raise ValueError("Only `transforms` or `transform`/`target_transform` can be passed, "
                         "not both (as torchvision's datasets).")


def open_pil(source: str | os.PathLike | Buffer, *, rgb: bool = True) -> Any:
    """``PIL.Image.open(source)`` (a path or encoded bytes), ``.convert("RGB")`` when ``rgb``:
    the stored orientation, as torchvision's datasets load images."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("a detection source without a gpufeed pipeline returns PIL images: "
                          "pip install pillow (or gpufeed[pil])") from exc
    if isinstance(source, (str, os.PathLike)):
        image = Image.open(source)
    else:
        image = Image.open(io.BytesIO(bytes(source)))
    return image.convert("RGB") if rgb else image


def to_torchvision(target: Any) -> Any:
    """``target`` with its leaves as ``tv_tensors`` (``BoundingBoxes``, ``Mask``,
    ``KeyPoints``), or as plain tensors where torchvision is not installed."""
    try:
        tv: Any = importlib.import_module("torchvision.tv_tensors")
    except ImportError:
        tv = None
    return map_leaves(target, lambda leaf: torch_leaf(leaf, tv))


def pipeline_item(source: Any, index: int, data: Buffer, record: Any,
                  pipeline: DetectionPipeline) -> tuple[Any, Any]:
    """Sample ``index`` through ``pipeline``: the image decoded by gpufeed as stored (EXIF
    orientation ignored, as PIL; a sequential JPEG only down to the rows the ops read), its
    target built by ``source.target_of``, the joint ops drawn from ``sample_rng(pipeline.seed
    or 0, source.epoch, index)``, then the output stage."""
    image: Any = None
    try:
        image = decode_source(data)
        sample = source_sample(image, source.target_of(index, record, source_size(image)))
        sample = pipeline.run(sample, sample_rng(pipeline.seed or 0, source.epoch, index))
        return pipeline.output(sample)
    except DecodeError as exc:
        if image is None or is_decode_failure(image, exc):
            raise DecodeError(f"cannot decode {source.describe(index)} (sample index {index}): "
                              f"{exc}. Check or remove the file.") from exc
        raise


def source_item(source: Any, index: int, plain: Callable[[int], tuple[Any, Any]]) -> tuple[Any, Any]:
    """A detection source's ``__getitem__``: sample ``index`` (negative: from the end) through
    its gpufeed pipeline (:func:`pipeline_item`), or ``plain(i)``'s (PIL image, target of
    ``tv_tensors``) through its callables (:func:`finish_item`). An OSError says the file."""
    n, i = len(source), operator.index(index)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"sample index {index} is out of range for {type(source).__name__} "
                         f"of length {n}.")
    pipeline = source.transforms if isinstance(source.transforms, DetectionPipeline) else None
    try:
        if pipeline is not None:
            data, record = source.read_item(i)
            return pipeline_item(source, i, data, record, pipeline)
        image, target = plain(i)
    except OSError as exc:
        add_note(exc, f"gpufeed: while reading {source.describe(i)} (sample index {i})")
        raise
    return finish_item(source, image, target)


def finish_item(source: Any, image: Any, target: Any) -> tuple[Any, Any]:
    """(PIL image, target of ``tv_tensors``) through ``source``'s callables: ``transforms`` on
    both, or ``transform`` on the image and ``target_transform`` on the target."""
    if source.transforms is not None:
        return source.transforms(image, target)
    if source.transform is not None:
        image = source.transform(image)
    if source.target_transform is not None:
        target = source.target_transform(target)
    return image, target
