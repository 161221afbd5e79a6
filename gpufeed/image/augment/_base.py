"""The contract of gpufeed's augmentation ops and where their random numbers come from.

An op works on one row of a batch after decode and geometry:

- :class:`RowOp`: a uint8 (H, W, 3) RGB row, C-contiguous (possibly a view into the batch slot);
- :class:`FloatRowOp`: a normalized float32 (3, H, W) row (torch tensor or numpy array), where
  torchvision and timm run ``RandomErasing``: after ``Normalize``.

Everything random is drawn in ``draw(rng, height, width)`` (the op's parameters, a small value);
``apply(row, params)`` is a pure function of the row and those parameters. The generator comes
from :func:`row_rng`, which depends on (seed, epoch, sample index) only: the same batches for
any ``num_workers``, a re-run batch byte for byte, exact resume.

Concrete ops are frozen dataclasses that check their arguments in ``__post_init__``.
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gpufeed.errors import shorten

__all__ = ["FLOAT_STREAM", "INTERP_STREAM", "ROW_STREAM", "FloatRowOp", "RowOp", "RowOps", "apply_ops",
           "row_rng"]

#: :func:`row_rng` streams: the uint8 ops of a row, its float ops (drawn where they run, which
#: may be another process or the GPU side) and the geometry's interpolation choice.
ROW_STREAM, FLOAT_STREAM, INTERP_STREAM = 0, 1, 2


def row_rng(seed: int, epoch: int, index: int, stream: int = ROW_STREAM, view: int = 0) -> np.random.Generator:
    """A generator that depends only on (seed, epoch, index, stream, view): SHAKE-128 of them
    (under a key of its own, so independent of the crop's words) seeds a PCG64. About 10 us.
    View 0 (a single-view transform) keeps the four-number key; view v >= 1 of a ``MultiView``
    appends ``:v``, so no stream of view 0 changes."""
    key = f"gpufeed-aug:{int(seed)}:{int(epoch)}:{int(index)}:{int(stream)}"
    if view:
        key += f":{int(view)}"
    words = struct.unpack("<4I", hashlib.shake_128(key.encode()).digest(16))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(words))))


class RowOp(ABC):
    """An augmentation on a uint8 (H, W, 3) RGB row."""

    #: torchvision-like name of the op, for ``explain`` and errors
    name: ClassVar[str] = "RowOp"

    @abstractmethod
    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        """This op's random parameters for a row of height x width pixels (None if none)."""

    @abstractmethod
    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        """``row`` transformed with ``params`` (what :meth:`draw` returned): same shape and dtype;
        may write into ``row`` and return it."""

    def __call__(self, row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draw and apply in one call."""
        return self.apply(row, self.draw(rng, row.shape[0], row.shape[1]))


class FloatRowOp(ABC):
    """An augmentation on a normalized float32 (3, H, W) row (torch tensor or numpy array)."""

    name: ClassVar[str] = "FloatRowOp"

    @abstractmethod
    def draw(self, rng: np.random.Generator, height: int, width: int) -> Any:
        """This op's random parameters for a row of height x width pixels (None if none)."""

    @abstractmethod
    def apply(self, row: Any, params: Any) -> Any:
        """``row`` transformed with ``params``; may write into ``row`` and return it."""

    def __call__(self, row: Any, rng: np.random.Generator) -> Any:
        return self.apply(row, self.draw(rng, row.shape[-2], row.shape[-1]))


def _check_ops(value: Any, kind: type, name: str) -> tuple[Any, ...]:
    if isinstance(value, (kind, str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"`{name}` must be a tuple of gpufeed {kind.__name__}s "
                        f"(gpufeed.image.augment). Found: {shorten(value)}.")
    ops = tuple(value)
    for op in ops:
        if not isinstance(op, kind):
            raise TypeError(f"`{name}` must hold gpufeed {kind.__name__}s (gpufeed.image.augment); "
                            f"fix: translate or drop it. Found: {type(op).__name__} {shorten(op)}.")
    return ops


def apply_ops(ops: Sequence[RowOp], row: np.ndarray, seed: int, epoch: int,
              index: int, view: int = 0) -> np.ndarray:
    """Run ``ops`` in order on ``row`` ((H, W, 3) uint8) of sample ``index`` (its view ``view``),
    their parameters drawn in order from one :func:`row_rng` (stream 0); returns the result."""
    if not ops:
        return row
    rng = row_rng(seed, epoch, index, ROW_STREAM, view)
    h, w = row.shape[:2]
    for op in ops:
        row = op.apply(row, op.draw(rng, h, w))
    return row


@dataclass(frozen=True)
class RowOps:
    """The augmentations of a transform: ``ops`` on the uint8 rows after geometry, in order,
    ``float_ops`` on the normalized float rows."""

    ops: tuple[RowOp, ...] = ()
    float_ops: tuple[FloatRowOp, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _check_ops(self.ops, RowOp, "ops"))
        object.__setattr__(self, "float_ops", _check_ops(self.float_ops, FloatRowOp, "float_ops"))

    def apply(self, row: np.ndarray, seed: int, epoch: int, index: int, view: int = 0) -> np.ndarray:
        """Run ``ops`` on ``row`` ((H, W, 3) uint8) for sample ``index``; returns the result
        (``row`` itself or a new array of its shape)."""
        return apply_ops(self.ops, row, seed, epoch, index, view)

    def apply_float(self, row: Any, seed: int, epoch: int, index: int, view: int = 0) -> Any:
        """Run ``float_ops`` on one normalized (3, H, W) row of sample ``index`` (its view
        ``view``)."""
        if not self.float_ops:
            return row
        rng = row_rng(seed, epoch, index, FLOAT_STREAM, view)
        h, w = row.shape[-2], row.shape[-1]
        for op in self.float_ops:
            row = op.apply(row, op.draw(rng, h, w))
        return row
