"""Ops gpufeed does not know, run as given on the rows of the fast path.

A torchvision op that accepts tensors, or a user's ``torch.nn.Module`` / callable placed after the
pipeline's conversion to a tensor, costs only itself: gpufeed still decodes, crops and resizes
into the batch row, then calls the op on that row as a tensor and writes the result back.

- :class:`TensorOp` (a :class:`~gpufeed.image.augment._base.RowOp`) calls the op on the uint8 row
  as a (3, H, W) uint8 tensor (``domain="uint8"``: where the original pipeline hands it a PIL
  image or a uint8 tensor), or as a (3, H, W) float32 tensor on the 0-1 scale (``domain="float"``:
  after ``ToTensor`` / ``ToDtype(float, scale=True)`` and before ``Normalize``), rounded back to
  uint8 (within half a grey level of the float result);
- :class:`TensorFloatOp` (a :class:`~gpufeed.image.augment._base.FloatRowOp`) calls it on the
  normalized float32 (3, H, W) row, for an op placed after ``Normalize``.

Randomness: each call runs with torch's default generator and Python's ``random`` (what
torchvision and timm draw from) seeded from the row's generator (itself from (seed, epoch,
sample index)), and restores their states afterwards, so batches are the same for any
``num_workers`` and the process's own random streams are left as they were. numpy's global
generator is not seeded (seeding it costs 0.1 ms a call, as much as a small op): an op that
draws from it is not reproducible.

Cost: the row goes to planes and back with OpenCV (``cv2.split`` / ``cv2.merge`` in place,
0.013 ms for 224x224 where numpy's or torch's transposing copy took 0.2-0.25 ms each way);
seeding and restoring the generators takes 0.03 ms.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpufeed.errors import shorten
from gpufeed.image._recipe_table import TIMM_PREFIX, TV_PREFIX
from gpufeed.image._resample import split_into
from gpufeed.image.augment._base import FloatRowOp, RowOp

__all__ = ["TensorFloatOp", "TensorOp", "op_text"]

_DOMAINS = ("uint8", "float")


#: op_text's bound for a user's object (its repr may hold data: a tensor, a table). torchvision's
#: and timm's ops are never cut: timm's AutoAugment lists its whole policy (2361 characters for
#: "original"), its RandAugment every op (about 800).
OP_TEXT_MAX = 500


def op_text(op: Any) -> str:
    """A one-line repr of ``op`` with all its parameters, for ``explain`` and messages (a
    function: its qualified name; a user's object whose repr is longer than ``OP_TEXT_MAX``
    characters: cut there)."""
    if inspect.isfunction(op):  # its name, not "<function f at 0x7f...>"
        return op.__qualname__
    text = " ".join(repr(op).replace("\n", " ").split())
    if len(text) <= OP_TEXT_MAX or type(op).__module__.startswith((TV_PREFIX, TIMM_PREFIX)):
        return text
    return text[:OP_TEXT_MAX - 3] + "..."


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's CPU generator and ``random`` seeded from ``seed``; their states
    are restored afterwards."""
    torch_state = torch.default_generator.get_state()
    py_state = random.getstate()
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.default_generator.set_state(torch_state)
        random.setstate(py_state)


def _as_tensor(result: Any, fn: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """``result`` as a plain tensor of ``shape``, or a ValueError naming the op."""
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"{op_text(fn)} returned {type(result).__name__} on a tensor row; gpufeed "
                        f"runs it on the fast path's rows as a (3, H, W) tensor and needs a tensor "
                        f"back. Fix: return a tensor, or place the op before the conversion to "
                        f"tensor so the pipeline runs as given.")
    if tuple(result.shape) != shape:
        raise ValueError(f"{op_text(fn)} changed the row's shape from {shape} to "
                         f"{tuple(result.shape)}; an op on the fast path's rows must keep it. Fix: "
                         f"do the resize/crop in the pipeline's crop op (gpufeed translates "
                         f"RandomResizedCrop / Resize + CenterCrop).")
    return result.as_subclass(torch.Tensor)


@dataclass(frozen=True)
class TensorOp(RowOp):
    """``fn`` (a tensor-capable op) on the uint8 (H, W, 3) row, given as a (3, H, W) tensor:
    uint8 for ``domain="uint8"``, float32 on the 0-1 scale for ``domain="float"``."""

    fn: Callable[[torch.Tensor], Any]
    domain: str = "uint8"
    name = "TensorOp"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"`fn` must be callable. Found: {type(self.fn).__name__} {shorten(self.fn)}.")
        if self.domain not in _DOMAINS:
            raise ValueError(f"`domain` must be one of {_DOMAINS}. Found: {shorten(self.domain)}.")

    def draw(self, rng: np.random.Generator, height: int, width: int) -> int:
        """The seed of the op's call (torch, random and numpy are seeded with it)."""
        return int(rng.integers(0, 1 << 63))

    def apply(self, row: np.ndarray, params: Any) -> np.ndarray:
        import cv2

        planes = np.empty((3, *row.shape[:2]), np.uint8)
        split_into(row, planes)
        image = torch.from_numpy(planes)
        if self.domain == "float":
            image = image.to(torch.float32).div_(255.0)
        with seeded(int(params)):
            result = _as_tensor(self.fn(image), self.fn, tuple(image.shape))
        if self.domain == "float" or result.dtype != torch.uint8:
            if result.is_floating_point():
                result = result.mul(255.0).round_()
            result = result.clamp_(0, 255).to(torch.uint8)
        out = result.contiguous().numpy()
        if cv2.merge([out[0], out[1], out[2]], dst=row) is not row:  # OpenCV allocated instead
            np.copyto(row, out.transpose(1, 2, 0))
        return row


@dataclass(frozen=True)
class TensorFloatOp(FloatRowOp):
    """``fn`` on a normalized float32 (3, H, W) row (an op after ``Normalize``)."""

    fn: Callable[[torch.Tensor], Any]
    name = "TensorFloatOp"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"`fn` must be callable. Found: {type(self.fn).__name__} {shorten(self.fn)}.")

    def draw(self, rng: np.random.Generator, height: int, width: int) -> int:
        """The seed of the op's call (torch, random and numpy are seeded with it)."""
        return int(rng.integers(0, 1 << 63))

    def apply(self, row: Any, params: Any) -> Any:
        tensor = row if isinstance(row, torch.Tensor) else torch.from_numpy(row)
        with seeded(int(params)):
            result = _as_tensor(self.fn(tensor), self.fn, tuple(tensor.shape))
        if result.data_ptr() != tensor.data_ptr() or result.stride() != tensor.stride():
            tensor.copy_(result)
        return row
