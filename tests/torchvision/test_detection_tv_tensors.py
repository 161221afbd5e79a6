"""tv_tensors through a FastLoader: a detection pipeline that ends without ToPureTensor gives
``tv_tensors`` (Image, BoundingBoxes, Mask); they cross the transport with their payload in the
arena and arrive with the same type, metadata and values as torch's DataLoader gives.

Real torchvision (``make test`` runs this folder in ``.venv-tv``).
"""

from __future__ import annotations

import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv (torch==2.14.1, torchvision==0.29.1)")

from torch.utils.data import DataLoader  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from gpufeed import FastLoader  # noqa: E402
from tests.integration._detection import (  # noqa: E402
    FilesDetection,
    Reference,
    assert_same,
    pipeline,
    tuple_collate,
    write_files,
)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_tv_tensors_arrive_with_their_type_metadata_and_values(tmp_path, num_workers):
    records = write_files(tmp_path / "images", 8)
    source = FilesDetection(records, pipeline(pure=False))
    fast = FastLoader(source, batch_size=4, num_workers=num_workers, seed=11, collate_fn=tuple_collate)
    got = list(fast)
    want = list(DataLoader(Reference(FilesDetection(records, pipeline(pure=False)), seed=11, epoch=0),
                           batch_size=4, collate_fn=tuple_collate))
    assert_same(got, want)  # types, __dict__ (format, canvas_size, clamping_mode) and values
    images, targets = got[0]
    assert all(type(im) is tv_tensors.Image for im in images)
    boxes = targets[1]["boxes"]
    assert type(boxes) is tv_tensors.BoundingBoxes
    assert boxes.format == tv_tensors.BoundingBoxFormat.XYXY
    assert boxes.canvas_size == tuple(images[1].shape[1:])
    assert type(targets[1]["masks"]) is tv_tensors.Mask
    assert fast.stats()["overflow_bytes"] == 0


def test_tv_tensor_images_lie_in_the_arena(tmp_path):
    records = write_files(tmp_path / "images", 4)
    fast = FastLoader(FilesDetection(records, pipeline(pure=False)), batch_size=4, num_workers=1,
                      collate_fn=tuple_collate)
    it = iter(fast)
    images, _ = next(it)
    arena = fast._arena
    spans = [(s.data_ptr(), s.data_ptr() + s.numel()) for s in map(arena.slot_tensor, range(arena.num_slots))]
    assert all(any(lo <= im.data_ptr() < hi for lo, hi in spans) for im in images)
    assert all(type(im) is tv_tensors.Image for im in images)
