"""Where each part of an image batch lies in its arena slot: named regions, one function.

A batch of n samples occupies its slot as (docs/design/sample-model.md, section 3)::

    [ view 0: n uint8 rows ] ... [ view V-1 ][ int64 labels: n (the labels route only) ]
    [ view 0 floats ] ... [ view V-1 floats ]   (only when the output dtype is not uint8)
    [ soft targets: n x num_classes float32 ]   (only with a batch op run in the workers)
    [ staging: the parent's encoded hits, then the worker's misses ... to the slot's end ]

Every region begins on an ``align_up`` (64-byte) boundary; within a region rows are contiguous.
The parent (which writes cache hits and makes all-hit batches) and the worker (which fills the
rest) both take the layout from :func:`slot_layout`, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpufeed._engine.layout import align_up

LABEL_BYTES = 8  # one int64 label per sample


@dataclass(frozen=True, slots=True)
class Region:
    """``nbytes`` bytes of a slot from byte ``start`` (a multiple of the arena's alignment)."""

    start: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.start + self.nbytes

    def of(self, buf: torch.Tensor) -> torch.Tensor:
        """This region of ``buf`` (a flat uint8 slot), as a flat uint8 tensor."""
        return buf[self.start : self.end]


@dataclass(frozen=True, slots=True)
class SlotLayout:
    """The regions of an n-sample image batch; ``staging`` is where the staging area begins.

    ``views``: the uint8 rows of each view (n rows of h*w*3 bytes); ``labels``: the int64 labels;
    ``floats``: each view's rows in the output dtype (empty for uint8 output); ``soft``: the
    float32 targets a batch op makes (MixUp, CutMix; empty without one). ``planned_bytes``
    (the staging start) is what ``max_batch_bytes`` must hold; the staging area is not planned.
    """

    n: int
    views: tuple[Region, ...]
    labels: Region
    floats: tuple[Region, ...]
    staging: int
    soft: Region = Region(0, 0)

    @property
    def planned_bytes(self) -> int:
        return self.staging


def slot_layout(n: int, row_bytes: Sequence[int], float_itemsize: int = 0, labels: bool = True,
                soft_bytes: int = 0) -> SlotLayout:
    """The layout of an n-sample batch whose view v has rows of ``row_bytes[v]`` uint8 bytes;
    ``float_itemsize``: bytes per element of the float output (0: the output is the uint8 rows);
    ``labels``: the targets are int64 labels in the slot (else their region is empty: targets
    collated in the worker take what they need after the staging area); ``soft_bytes``: bytes
    per sample of a batch op's soft targets (0: none)."""
    cursor = 0
    views = []
    for nbytes in row_bytes:
        views.append(Region(cursor, n * nbytes))
        cursor = align_up(cursor + n * nbytes)
    label_region = Region(cursor, LABEL_BYTES * n if labels else 0)
    cursor = align_up(label_region.end)
    floats = []
    if float_itemsize:
        for nbytes in row_bytes:
            floats.append(Region(cursor, n * nbytes * float_itemsize))
            cursor = align_up(cursor + n * nbytes * float_itemsize)
    soft = Region(cursor, n * soft_bytes)
    cursor = align_up(soft.end)
    return SlotLayout(n, tuple(views), label_region, tuple(floats), cursor, soft)
