"""``DetectionSource``: the protocol of a dataset whose samples are an image and a target of
boxes, masks or keypoints (``CocoDetection``, image + mask-file pairs), which a loader runs on
the per-sample fast path (``docs/design/detection.md``)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from gpufeed.decoders._header import Buffer

__all__ = ["DetectionSource"]


class DetectionSource(Dataset):
    """Subclasses implement ``__len__``, :meth:`read_item`, :meth:`target_of` and
    :meth:`describe`, and hold ``transforms``: None, a translated
    :class:`~gpufeed.image.detection.DetectionPipeline` (the fast path), or a callable taking
    (PIL image, target) (the generic path).

    ``read_item(i)`` returns (encoded bytes, record): the record is whatever the source needs to
    build the target (an annotation slice); it must be thread-safe (workers read ahead).
    ``target_of(i, record, canvas)`` builds the target pytree, whose boxes, masks and keypoints
    are :mod:`gpufeed.image.detection` leaves on a canvas of (H, W) = the decoded image's size.
    """

    epoch: int = 0
    transforms: Any = None

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
