"""Tensor subclasses (torchvision's ``tv_tensors`` are such) cross the transport with their
payload in the arena slot and their class and ``__dict__`` in the skeleton."""

from __future__ import annotations

import pickle

import pytest
import torch

from gpufeed._engine.arena import Arena, SlotWriter
from gpufeed._engine.transport import pack, unpack

SLOT = 1 << 20


class Tagged(torch.Tensor):
    """A tensor with Python attributes, like ``tv_tensors.BoundingBoxes``."""


class OwnPickling(torch.Tensor):
    def __reduce_ex__(self, protocol):
        return (_rebuild_own, (self.as_subclass(torch.Tensor).clone(),))


def _rebuild_own(t: torch.Tensor) -> OwnPickling:
    return t.as_subclass(OwnPickling)


def tagged(t: torch.Tensor, **attrs) -> Tagged:
    out = t.as_subclass(Tagged)
    out.__dict__.update(attrs)
    return out


@pytest.fixture
def slot():
    arena = Arena(SLOT, warm_cap=2)
    writer = SlotWriter(arena.handle())
    index = arena.acquire()
    writer.begin(index)
    yield arena, writer, index
    writer.end()
    arena.close()


def _round_trip(arena: Arena, writer: SlotWriter, index: int, data):
    skeleton, used, overflow = pack(data, writer)
    return skeleton, overflow, unpack(skeleton, arena.lease(index, used))


def test_a_subclass_payload_travels_in_the_slot_with_its_attributes(slot):
    arena, writer, index = slot
    boxes = tagged(torch.arange(1200, dtype=torch.float32).view(300, 4), format="XYXY", canvas_size=(5, 7))
    skeleton, overflow, out = _round_trip(arena, writer, index, {"boxes": boxes, "n": 3})
    assert overflow == 0
    got = out["boxes"]
    assert type(got) is Tagged
    assert got.__dict__ == {"format": "XYXY", "canvas_size": (5, 7)}
    assert torch.equal(got.as_subclass(torch.Tensor), boxes.as_subclass(torch.Tensor))
    assert len(skeleton) < 400 < boxes.nbytes <= writer.pos  # the payload is in the slot


def test_a_subclass_already_in_the_slot_goes_by_reference(slot):
    arena, writer, index = slot
    inside = writer.tensor((2, 3, 4), torch.uint8)
    assert inside is not None
    inside.copy_(torch.arange(24, dtype=torch.uint8).view(2, 3, 4))
    used_before = writer.pos
    image = tagged(inside)
    skeleton, overflow, out = _round_trip(arena, writer, index, [image])
    assert overflow == 0 and writer.pos == used_before  # nothing copied
    assert type(out[0]) is Tagged
    assert torch.equal(out[0].as_subclass(torch.Tensor), inside)


def test_views_of_one_subclass_share_their_storage_in_the_parent(slot):
    arena, writer, index = slot
    base = tagged(torch.arange(8, dtype=torch.int64), kind="masks")
    with torch._C.DisableTorchFunctionSubclass():
        a, b = base[:4].as_subclass(Tagged), base[4:].as_subclass(Tagged)
    a.__dict__.update(kind="a")
    b.__dict__.update(kind="b")
    _, _, (ga, gb) = _round_trip(arena, writer, index, (a, b))
    assert (ga.kind, gb.kind) == ("a", "b")
    assert ga.untyped_storage().data_ptr() == gb.untyped_storage().data_ptr()
    assert ga.tolist() == [0, 1, 2, 3] and gb.tolist() == [4, 5, 6, 7]


def test_subclasses_with_their_own_pickling_and_parameters_keep_it(slot):
    arena, writer, index = slot
    own = torch.ones(4).as_subclass(OwnPickling)
    param = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    skeleton, _, (g_own, g_param) = _round_trip(arena, writer, index, (own, param))
    assert type(g_own) is OwnPickling and torch.equal(g_own.as_subclass(torch.Tensor), torch.ones(4))
    assert type(g_param) is torch.nn.Parameter and not g_param.requires_grad


def test_a_subclass_that_requires_grad_is_pickled_as_torch_would(slot):
    arena, writer, index = slot
    t = tagged(torch.ones(3), label="w").requires_grad_()
    _, _, out = _round_trip(arena, writer, index, t)
    assert out.requires_grad and type(out) is Tagged and out.label == "w"
    assert pickle.loads(pickle.dumps(t)).label == "w"
