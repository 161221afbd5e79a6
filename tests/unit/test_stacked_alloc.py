"""The per-sample path lays a batch's outputs out as ``torch.stack`` would (``StackedAlloc``),
and the worker's tensor collate then returns a view instead of a copy (``SlotWriter.stacked``):
same values as torch's ``default_collate``, nothing copied, and a copy wherever the layout is
not a stack's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from gpufeed._engine import worker
from gpufeed._engine.arena import Arena, SlotWriter
from gpufeed._engine.transport import pack, unpack
from gpufeed.image._sample_fill import StackedAlloc

SLOT = 8 << 20


@pytest.fixture
def slot(monkeypatch):
    arena = Arena(SLOT, warm_cap=2)
    writer = SlotWriter(arena.handle())
    index = arena.acquire()
    writer.begin(index)
    monkeypatch.setattr(worker, "_writer", writer)
    monkeypatch.setitem(torch.utils.data._utils.collate.default_collate_fn_map, torch.Tensor,
                        worker._collate_tensor_into_slot)
    yield arena, writer, index
    writer.end()
    arena.close()


def _samples(writer: SlotWriter, n: int, sizes=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n (image, mask) pairs made as the output stage makes them: image first, then the mask."""
    allocs = StackedAlloc(writer, n)
    out = []
    for pos in range(n):
        alloc = allocs(pos)
        h, w = (sizes or [(6, 5)] * n)[pos]
        image = alloc((3, h, w), torch.float32).copy_(torch.rand(3, h, w))
        mask = alloc((1, h, w), torch.uint8).copy_(torch.randint(0, 21, (1, h, w), dtype=torch.uint8))
        out.append((image, mask))
    return out


def test_a_stack_of_the_outputs_is_a_view_with_default_collates_values(slot):
    arena, writer, index = slot
    samples = _samples(writer, 4)
    expected = [torch.stack([s[0] for s in samples]).clone(), torch.stack([s[1] for s in samples]).clone()]
    used_before = writer.pos
    images, masks = default_collate(samples)
    assert writer.pos == used_before  # nothing new allocated: no copy
    assert images.data_ptr() == samples[0][0].data_ptr() and masks.data_ptr() == samples[0][1].data_ptr()
    assert torch.equal(images, expected[0]) and torch.equal(masks, expected[1])
    assert images.is_contiguous() and images.shape == (4, 3, 6, 5)
    skeleton, used, overflow = pack([images, masks], writer)
    got = unpack(skeleton, arena.lease(index, used))
    assert overflow == 0
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_outputs_of_other_sizes_get_regions_of_their_own_and_are_stacked_by_copy(slot):
    _, writer, _ = slot
    samples = _samples(writer, 3, sizes=[(6, 5), (4, 5), (6, 5)])
    # the odd one is not in the lane: a list of them cannot be stacked; the same-size ones can
    same = [samples[0], samples[2]]
    before = writer.pos
    images, _ = default_collate(same)
    assert writer.pos > before  # copied into a new region (they are not adjacent)
    assert torch.equal(images, torch.stack([same[0][0], same[1][0]]))
    assert samples[1][0].shape == (3, 4, 5)


def test_a_batch_with_a_sample_left_out_is_copied_not_viewed(slot):
    _, writer, _ = slot
    samples = _samples(writer, 4)
    kept = [samples[0], samples[1], samples[3]]  # position 2 skipped (on_error="skip")
    images, masks = default_collate(kept)
    assert images.data_ptr() != samples[0][0].data_ptr()
    assert torch.equal(images, torch.stack([k[0] for k in kept]))
    assert torch.equal(masks, torch.stack([k[1] for k in kept]))


def test_tensors_outside_the_slot_or_not_contiguous_are_never_viewed(slot):
    _, writer, _ = slot
    outside = [torch.rand(2, 3), torch.rand(2, 3)]
    assert writer.stacked(outside) is None
    lane = writer.tensor((2, 3, 2), torch.float32)
    assert lane is not None
    transposed = [lane[0].t(), lane[1].t()]
    assert writer.stacked(transposed) is None
    assert writer.stacked([lane[0], lane[1].to(torch.float64)]) is None
    assert writer.stacked([lane[1], lane[0]]) is None  # adjacent, but in the wrong order
    view = writer.stacked([lane[0], lane[1]])
    assert view is not None and view.data_ptr() == lane.data_ptr() and view.shape == (2, 3, 2)


def test_no_lane_is_reserved_when_it_would_take_more_than_a_quarter_of_the_slot(slot):
    _, writer, _ = slot
    big = SLOT // 8  # bytes a sample: 64 of them are 8x the slot
    allocs = StackedAlloc(writer, 64)
    t = allocs(0)((big // 4,), torch.float32)
    assert writer.pos < 2 * big  # one sample's region, not a lane of 64
    assert t.numel() == big // 4


def test_an_output_whose_shapes_differ_gets_no_lane_in_later_batches(slot):
    """Variable-size images: once their shapes differ in a batch, later batches lay them out
    one after another (no lane whose rows would push the regions further into the slot)."""
    _, writer, _ = slot
    unstackable: set[int] = set()
    allocs = StackedAlloc(writer, 4, unstackable)
    for pos, h in enumerate((6, 4, 6, 5)):
        allocs(pos)((3, h, 5), torch.float32)
        allocs(pos)((1, 6, 5), torch.uint8)  # masks: same shape every time
    assert unstackable == {0}
    start = writer.pos
    later = StackedAlloc(writer, 4, unstackable)
    first = later(0)((3, 6, 5), torch.float32)
    assert first.data_ptr() - writer.buffer.data_ptr() < start + 3 * 6 * 5 * 4 + 64  # right here, no lane
    mask = later(0)((1, 6, 5), torch.uint8)
    assert writer.pos - start >= 4 * 30  # the mask's lane: 4 rows
    assert mask.shape == (1, 6, 5)
