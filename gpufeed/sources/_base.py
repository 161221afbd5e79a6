"""ImageSource: the map-style dataset contract of gpufeed's image fast path.

The loader's workers call :meth:`ImageSource.read`, :meth:`ImageSource.label` and the source's
``transform.apply`` themselves, writing into batch rows; ``__getitem__`` does the same into a
fresh tensor, so every source also works under ``torch.utils.data.DataLoader``. A transform that
is a torchvision pipeline of ops gpufeed knows is translated to the fast path
(``gpufeed.image``); any other callable (a function, an untranslatable torchvision
``Compose``) is called on a PIL image by ``__getitem__``, and the loader takes its generic path.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gpufeed.decoders import decode, read_header
from gpufeed.decoders._header import Buffer
from gpufeed.errors import DecodeError, add_note, describe_callable
from gpufeed.image._torchvision import is_torchvision, translate_or_none, warn_fallback
from gpufeed.image._transforms import ImageTransform, stored_orientation
from gpufeed.image._views import MultiView
from gpufeed.sources._read_options import ReadOptions

log = logging.getLogger(__name__)

PIL_HINT = "pip install gpufeed[pil] (or pip install pillow)"
#: Reads in flight per worker for gpufeed's own local sources (files, LMDB), and their byte
#: budget. None, "auto": each worker reads one sample at a time until its reads stall it, then
#: reads ahead (``gpufeed.image._auto_reads``). On local disk (page cache) 16 read threads per
#: worker cost 6-11% of the steady eval rate on 2 cores (median steady img/s over 8 epochs, 4
#: alternating runs: 2059-2361 against 2317-2626 with one read at a time), so auto stays at one
#: there; a network file system mounted as a local path switches by itself.
DEFAULT_READ_CONCURRENCY: int | None = None


def pil_image_module() -> Any:
    """``PIL.Image``, or an ImportError naming the install command (Pillow is the ``pil`` extra)."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(f"a callable `transform` is given PIL images, which needs Pillow: "
                          f"{PIL_HINT}. Or use gpufeed.ResizeCenterCrop / RandomResizedCrop, "
                          f"which need no Pillow.") from exc
    return Image


class ImageSource(ReadOptions, Dataset):
    """A map-style dataset of encoded images and their targets (integer labels, or any object).

    Subclasses implement ``__len__``, :meth:`read`, :meth:`label` and :meth:`describe`; a source
    whose targets are not all int labels overrides :meth:`target` and sets :attr:`int_targets`
    to False.
    ``transform`` is one of (checked when set, a TypeError otherwise):

    - None: ``__getitem__`` returns the full decoded image, a uint8 CHW tensor;
    - a gpufeed transform (``ResizeCenterCrop``, ``RandomResizedCrop``), applied with ``epoch``
      (default 0, see :meth:`set_epoch`) and seed ``transform.seed or 0``: the loader's fast path;
    - a torchvision pipeline (``torchvision.transforms`` or ``.v2``, or a classification preset
      of torchvision's references holding one) of the ops
      :func:`gpufeed.from_torchvision` translates: replaced by its translation (the fast path,
      ``dataset[i]`` returning what the pipeline returns); one INFO log line says which ops
      run where (:func:`gpufeed.explain`). A pipeline it cannot translate is kept as given;
    - any other callable (a function, such a pipeline): it is called on the decoded
      image as a PIL RGB image, as torchvision's datasets do, and its result is returned as is;
      a loader takes its generic path (per-sample ``__getitem__`` + collate), slower. Pillow is
      then needed (``pip install gpufeed[pil]``). Unlike torchvision's default loader, the image
      is decoded by gpufeed, so EXIF orientation is applied (as on the fast path), except for
      torchvision pipelines, which see the image as stored, as in torchvision.

    ``target_transform``, if set, is called on the sample's target by ``__getitem__``, and on the
    loader's image path in the workers, per sample, as ``DataLoader``'s workers call it. Targets
    are then collated by ``default_collate`` in the workers; int labels without a
    ``target_transform`` are written straight into the batch as int64.

    ``read_concurrency``: on the loader's image path, each worker reads up to this many samples
    of its batch at once (on threads, ``gpufeed-read-K``) while it decodes earlier ones, which
    hides storage latency (network file systems, cloud disks); 1 reads one sample at a time.
    With ``read_auto`` (the constructors' ``read_concurrency=None``), ``read_concurrency`` is 1
    and each worker switches to read-ahead by itself once its reads take at least half as
    long as its decoding (2 to 64 reads in flight, from the measured read latency).
    ``read_budget_bytes`` bounds the bytes a worker has read (or is reading) and not yet
    decoded. Both are set by the subclasses' constructors; :meth:`read_item` must then be
    thread-safe.
    """

    epoch: int = 0
    #: Every target is the int label ``label(i)`` (batched as int64 labels); False: targets of
    #: any type, :meth:`target`, collated by ``default_collate``.
    int_targets: bool = True
    target_transform: Callable[[Any], Any] | None = None
    #: path -> image (torchvision's ``loader``), used instead of gpufeed's decode by
    #: ``__getitem__``; only sources with file paths (``ImageFolder``) take one.
    loader: Callable[[str], Any] | None = None
    _transform: Any = None

    @property
    def transform(self) -> Any:
        """None, a gpufeed ``ImageTransform`` (a translated torchvision pipeline is a
        ``TorchvisionPipeline``), or any callable taking a PIL image."""
        return self._transform

    @transform.setter
    def transform(self, value: Any) -> None:
        if self.loader is None and not isinstance(value, ImageTransform) and is_torchvision(value):
            translated, report = translate_or_none(value)
            log.info("gpufeed: %s: %s", type(self).__name__, report)
            if translated is None:
                warn_fallback(value, type(self).__name__)
            value = value if translated is None else translated
        if _decodes(value) and self.loader is not None:
            raise ValueError(f"a gpufeed transform ({type(value).__name__}) decodes the bytes "
                             f"itself, so it cannot follow a `loader` ({describe_callable(self.loader)}"
                             f"). Drop `loader`, or pass a callable transform that takes what "
                             f"the loader returns.")
        if value is not None and not _decodes(value):
            if not callable(value):
                raise TypeError(f"`transform` must be None, a gpufeed transform "
                                f"(ResizeCenterCrop, RandomResizedCrop) or a callable taking a "
                                f"PIL image. Found: {type(value).__name__} {_short(value)}.")
            if self.loader is None:
                pil_image_module()  # fail here, before any worker starts
        self._transform = value

    @property
    def calls_transform(self) -> bool:
        """True when ``transform`` is a user callable (not a gpufeed transform or a translated
        ``MultiView``, not None)."""
        return self._transform is not None and not _decodes(self._transform)

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, index: int) -> Buffer:
        """The encoded bytes of sample ``index``."""
        raise NotImplementedError

    def label(self, index: int) -> int:
        """The integer class label of sample ``index``."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """Where sample ``index`` comes from (a file path, ``lmdb:KEY``...), for messages."""
        return f"{type(self).__name__}[{index}]"

    def target(self, index: int) -> Any:
        """The target of sample ``index``, before ``target_transform``: its int label unless a
        subclass says otherwise (then :attr:`int_targets` is False)."""
        return self.label(index)

    def read_item(self, index: int) -> tuple[Buffer, Any]:
        """(encoded bytes, target) of sample ``index``; one read where a source can do both."""
        return self.read(index), self.target(index)

    def set_epoch(self, epoch: int) -> None:
        """Epoch used by ``__getitem__`` for random transforms (the fast path passes its own)."""
        self.epoch = operator.index(epoch)

    def decode_into(self, index: int, data: Buffer, out: np.ndarray | None = None, *,
                    epoch: int | None = None, seed: int | None = None) -> np.ndarray:
        """Decode (and transform) ``data``, the bytes of sample ``index``, into ``out``.

        With a transform, ``out`` is (H, W, 3) or (3, H, W) uint8 (allocated CHW when None);
        without one, the full image is returned as a new CHW array. ``epoch``/``seed`` default to
        ``self.epoch`` and ``transform.seed or 0``. Errors are :class:`DecodeError` naming
        :meth:`describe` and the index.
        """
        try:
            if self.transform is None:
                return np.ascontiguousarray(decode(data).transpose(2, 0, 1))
            if out is None:
                out = np.empty((3, *self.transform.output_size), np.uint8)
            self.transform.apply(
                data, index=index, epoch=self.epoch if epoch is None else epoch,
                seed=(getattr(self.transform, "seed", None) or 0) if seed is None else seed,
                out=out)
            return out
        except DecodeError as exc:
            raise DecodeError(f"cannot decode {self.describe(index)} (sample index {index}): "
                              f"{exc}. Check or remove the file.") from exc

    def _views_of(self, index: int, data: Buffer) -> list[Any]:
        """Each view of sample ``index`` under a ``MultiView`` transform (one decode)."""
        transform = self._transform
        try:
            return transform.outputs(data, index=index, epoch=self.epoch, seed=transform.seed or 0)
        except DecodeError as exc:
            raise DecodeError(f"cannot decode {self.describe(index)} (sample index {index}): "
                              f"{exc}. Check or remove the file.") from exc

    def pil_image(self, index: int, data: Buffer) -> Any:
        """``data``, the bytes of sample ``index``, decoded (EXIF orientation applied) into a PIL
        RGB image. Errors are :class:`DecodeError` naming :meth:`describe` and the index."""
        image_module = pil_image_module()
        try:
            header = read_header(data)
            if is_torchvision(self._transform) or (  # as torchvision's PIL loader: EXIF ignored
                    isinstance(self._transform, MultiView) and not self._transform.apply_exif):
                header = stored_orientation(header)
            return image_module.fromarray(decode(data, header=header), "RGB")
        except DecodeError as exc:
            raise DecodeError(f"cannot decode {self.describe(index)} (sample index {index}): "
                              f"{exc}. Check or remove the file.") from exc

    def load_sample(self, index: int) -> tuple[Any, Any]:
        """(image, target) of sample ``index`` for a callable ``transform`` or a ``loader``: the
        loader's result for the sample's path where a subclass has one, else the PIL image."""
        data, label = self.read_item(index)
        return self.pil_image(index, data), label

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """(image, target) of sample ``index``: a uint8 CHW tensor without a transform or with a
        gpufeed one, the callable's result with any other (the ``loader``'s result with neither);
        the target (an int label where :attr:`int_targets`) is passed through
        ``target_transform`` if set."""
        i = self._check_index(index)
        by_pil = self.calls_transform or self.loader is not None
        try:
            if by_pil:
                sample, label = self.load_sample(i)
            else:
                data, label = self.read_item(i)
        except OSError as exc:
            add_note(exc, f"gpufeed: while reading {self.describe(i)} (sample index {i})")
            raise
        if not by_pil and isinstance(self._transform, MultiView):
            image: Any = self._views_of(i, data)
        elif not by_pil:
            image = torch.from_numpy(self.decode_into(i, data))
            if self._transform is not None:
                image = self._transform.to_output(
                    image, index=i, epoch=self.epoch,
                    seed=getattr(self._transform, "seed", None) or 0)
        elif self._transform is None:
            image = sample
        else:
            image = self._transform(sample)
        target = int(label) if self.int_targets else label
        return image, (target if self.target_transform is None else self.target_transform(target))

    def _check_index(self, index: int) -> int:
        n = len(self)
        i = operator.index(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {index} is out of range for {type(self).__name__} "
                             f"of length {n}.")
        return i


def _decodes(transform: Any) -> bool:
    """``transform`` decodes the bytes itself: a gpufeed transform, or a ``MultiView`` whose
    pipelines all translate (the image fast path)."""
    return isinstance(transform, ImageTransform) or (
        isinstance(transform, MultiView) and transform.translated)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class LabelArray:
    """:meth:`ImageSource.label`, ``labels`` and ``targets`` of a source that keeps every label in
    one int64 array, ``_labels`` (ImageFolder, TarShards)."""

    _labels: np.ndarray

    def label(self, index: int) -> int:
        return int(self._labels[index])

    @property
    def labels(self) -> np.ndarray:
        """All labels, int64 (read-only)."""
        return self._labels

    @property
    def targets(self) -> list[int]:
        """All labels as a list, as torchvision's ``targets``."""
        return self._labels.tolist()
