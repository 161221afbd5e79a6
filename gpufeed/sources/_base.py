"""ImageSource: the map-style dataset contract of gpufeed's image fast path.

The loader's workers call :meth:`ImageSource.read`, :meth:`ImageSource.label` and the source's
``transform.apply`` themselves, writing into batch rows; ``__getitem__`` does the same into a
fresh tensor, so every source also works under ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gpufeed.decode import decode
from gpufeed.decode._header import Buffer
from gpufeed.errors import DecodeError, add_note


class ImageSource(Dataset):
    """A map-style dataset of encoded images and integer labels.

    Subclasses implement ``__len__``, :meth:`read`, :meth:`label` and :meth:`describe`.
    ``transform`` is None (``__getitem__`` returns the full decoded image) or a gpufeed transform
    (``ResizeCenterCrop``, ``RandomResizedCrop``), applied with ``epoch`` (default 0, see
    :meth:`set_epoch`) and seed ``transform.seed or 0``.
    """

    transform: Any = None
    epoch: int = 0

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

    def read_item(self, index: int) -> tuple[Buffer, int]:
        """(encoded bytes, label) of sample ``index``; one read where a source can do both."""
        return self.read(index), self.label(index)

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

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """(uint8 CHW image tensor, label) of sample ``index``."""
        i = self._check_index(index)
        try:
            data, label = self.read_item(i)
        except OSError as exc:
            add_note(exc, f"gpufeed: while reading {self.describe(i)} (sample index {i})")
            raise
        return torch.from_numpy(self.decode_into(i, data)), int(label)

    def _check_index(self, index: int) -> int:
        n = len(self)
        i = operator.index(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {index} is out of range for {type(self).__name__} "
                             f"of length {n}.")
        return i
