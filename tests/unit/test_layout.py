"""The slot layout's one alignment: the engine's allocations and the image path's regions."""

from __future__ import annotations

import mmap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed._engine.arena import Arena, SlotWriter
from gpufeed._engine.layout import ALIGN_BYTES, align_up
from gpufeed.image import ResizeCenterCrop
from gpufeed.image._fill import ImagePlan
from gpufeed.image._slot import Region, slot_layout


def test_align_up_is_the_next_multiple():
    assert [align_up(n) for n in (0, 1, ALIGN_BYTES - 1, ALIGN_BYTES, ALIGN_BYTES + 1)] == [
        0, ALIGN_BYTES, ALIGN_BYTES, ALIGN_BYTES, 2 * ALIGN_BYTES]


def test_slot_writer_allocations_start_on_the_alignment():
    arena = Arena(4 * mmap.PAGESIZE, warm_cap=1)
    try:
        slot = arena.acquire()
        writer = SlotWriter(arena.handle())
        writer.begin_late(lambda: slot)
        starts = [writer.alloc(n) for n in (3, 100, 1, ALIGN_BYTES)]
        writer.end()
        assert starts == [0, ALIGN_BYTES, 3 * ALIGN_BYTES, 4 * ALIGN_BYTES]
    finally:
        arena.close()


def _offsets_before_slot_layout(n: int, row_bytes: int, itemsize: int) -> tuple[int, int, int]:
    """The (labels, floats, staging) offsets ``ImagePlan.offsets`` gave before ``SlotLayout``."""
    labels = align_up(n * row_bytes)
    floats = align_up(labels + 8 * n)
    staging = floats if itemsize == 0 else align_up(floats + n * row_bytes * itemsize)
    return labels, floats, staging


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("size", [(7, 5), (224, 224), (33, 17)])
@pytest.mark.parametrize("n", [1, 3, 64])
def test_one_view_layout_is_the_offsets_of_before(dtype, size, n):
    plan = ImagePlan(transform=ResizeCenterCrop(size=size, resize=max(size)), dtype=dtype)
    layout = plan.layout(n)
    itemsize = 0 if dtype == torch.uint8 else dtype.itemsize
    labels, floats, staging = _offsets_before_slot_layout(n, plan.row_bytes, itemsize)
    assert layout.views == (Region(0, n * plan.row_bytes),)
    assert layout.labels == Region(labels, 8 * n)
    assert layout.floats == (() if dtype == torch.uint8 else (Region(floats, n * plan.row_bytes * itemsize),))
    assert layout.staging == layout.planned_bytes == staging


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 300), rows=st.lists(st.integers(1, 3 * 512 * 512), min_size=1, max_size=8),
       itemsize=st.sampled_from([0, 2, 4, 8]), labels=st.booleans())
def test_regions_are_aligned_disjoint_and_in_order(n, rows, itemsize, labels):
    layout = slot_layout(n, rows, itemsize, labels)
    regions = [*layout.views, layout.labels, *layout.floats]
    assert len(layout.views) == len(rows) and len(layout.floats) == (len(rows) if itemsize else 0)
    assert [r.nbytes for r in layout.views] == [n * b for b in rows]
    assert [r.nbytes for r in layout.floats] == ([n * b * itemsize for b in rows] if itemsize else [])
    assert layout.labels.nbytes == (8 * n if labels else 0)
    assert all(r.start % ALIGN_BYTES == 0 for r in regions) and layout.staging % ALIGN_BYTES == 0
    for before, after in zip(regions, regions[1:]):
        assert before.end <= after.start < before.end + ALIGN_BYTES  # disjoint, no gap but padding
    assert regions[-1].end <= layout.staging < regions[-1].end + ALIGN_BYTES
