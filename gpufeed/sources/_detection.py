"""``DetectionSource``: the protocol of a dataset whose samples are an image and a target of
boxes, masks or keypoints (``CocoDetection``, image + mask-file pairs), which a loader runs on
the per-sample fast path (``docs/design/detection.md``)."""

from __future__ import annotations

import logging
from typing import Any

from torch.utils.data import Dataset

from gpufeed.decoders._header import Buffer
from gpufeed.image.detection._pipeline import DetectionPipeline
from gpufeed.image.detection._translate import translate_detection
from gpufeed.sources._read_options import ReadOptions

log = logging.getLogger(__name__)

__all__ = ["DetectionSource"]


class DetectionSource(ReadOptions, Dataset):
    """Subclasses implement ``__len__``, :meth:`read_item`, :meth:`target_of` and
    :meth:`describe`, and hold ``transforms``: None, a translated
    :class:`~gpufeed.image.detection.DetectionPipeline` (the fast path), or a callable taking
    (PIL image, target) (the generic path).

    ``read_item(i)`` returns (encoded bytes, record): the record is whatever the source needs to
    build the target (an annotation slice); it must be thread-safe (workers read ahead).
    ``target_of(i, record, canvas)`` builds the target pytree, whose boxes, masks and keypoints
    are :mod:`gpufeed.image.detection` leaves on a canvas of (H, W) = the decoded image's size.
    Read-ahead in the workers (``read_concurrency``, ``read_auto``, ``read_budget_bytes``) as
    for the image sources (:class:`~gpufeed.sources.ImageSource`); a subclass's constructor sets
    them with ``set_read_options``.
    """

    epoch: int = 0
    _transforms: Any = None

    @property
    def transforms(self) -> Any:
        """None, a :class:`DetectionPipeline` (translated: the fast path) or a callable taking
        (PIL image, target) (the generic path)."""
        return self._transforms

    @transforms.setter
    def transforms(self, value: Any) -> None:
        if value is not None and not isinstance(value, DetectionPipeline):
            if not callable(value):
                raise TypeError(f"`transforms` must be None, a torchvision v2 pipeline or a "
                                f"callable taking (image, target). Found: {type(value).__name__}.")
            translated, report = translate_detection(value)
            log.info("gpufeed: %s: %s", type(self).__name__, report)
            if translated is not None:
                value = translated
        self._transforms = value

    def __len__(self) -> int:
        raise NotImplementedError

    def read_item(self, index: int) -> tuple[Buffer, Any]:
        """(encoded bytes, record) of sample ``index``."""
        raise NotImplementedError

    def target_of(self, index: int, record: Any, canvas: tuple[int, int]) -> Any:
        """The target of sample ``index`` (leaves in numpy, see the class docstring)."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """Where sample ``index`` comes from (a file path), for messages."""
        return f"{type(self).__name__}[{index}]"

    def set_epoch(self, epoch: int) -> None:
        """Epoch of ``__getitem__``'s random draws (the loader passes its own)."""
        self.epoch = int(epoch)
