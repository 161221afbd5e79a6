"""The slot layout's one alignment: the engine's allocations and the image path's regions."""

from __future__ import annotations

import mmap

import pytest
import torch

from gpufeed._engine.arena import Arena, SlotWriter
from gpufeed._engine.layout import ALIGN_BYTES, align_up
from gpufeed.image import ResizeCenterCrop
from gpufeed.image._fill import ImagePlan


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


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("size", [(7, 5), (224, 224)])
@pytest.mark.parametrize("n", [1, 3, 64])
def test_image_plan_regions_start_on_the_arena_alignment(dtype, size, n):
    plan = ImagePlan(transform=ResizeCenterCrop(size=size, resize=max(size)), dtype=dtype)
    labels, floats, staging = plan.offsets(n)
    assert all(off % ALIGN_BYTES == 0 for off in (labels, floats, staging))
    assert labels >= n * plan.row_bytes and floats >= labels + 8 * n
    assert staging >= floats + (0 if dtype == torch.uint8 else n * plan.row_bytes * dtype.itemsize)
