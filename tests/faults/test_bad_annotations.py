"""COCO segmentations that pycocotools cannot rasterise faithfully, asked for as masks, through
the loader in the main process and in workers. Where torchvision's wrapper gives a mask of
uninitialised memory (a short RLE), hangs or runs out of memory (a NaN coordinate) or raises an
error naming nothing (an empty polygon list, a bad RLE string), gpufeed raises a
``DecodeError`` naming the annotation file, the image id, the annotation and the fix, and
``on_error="skip"`` leaves the sample out. Degenerate segmentations that pycocotools does
rasterise keep its masks."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from gpufeed import DecodeError, FastLoader
from gpufeed._synth_coco import make_coco
from gpufeed.image.detection import DetectionPipeline
from gpufeed.sources import CocoDetection
from tests.integration._detection import tuple_collate

pytestmark = pytest.mark.timeout(60)

KEYS = ["image_id", "boxes", "masks"]
# sample index -> what replaces its first annotation's segmentation, and what the error says
DAMAGE = {
    1: ({"counts": [10, 20, 30], "size": None}, "run lengths sum to 60 pixels"),
    2: ([[1.0, 2.0, float("nan"), 12.0, 5.0, 30.0]], "not a finite number"),
    4: ([], "an empty list of polygons"),
    5: ({"counts": "a b c", "size": None}, "outside '0' to 'o'"),
}


def _dataset(coco, ann_file):
    return CocoDetection(coco.root, ann_file, transforms=DetectionPipeline(image_dtype=torch.uint8),
                         target_keys=KEYS)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """(dataset over the damaged file, the same over the original, the damaged file's path)."""
    root = tmp_path_factory.mktemp("bad-annotations")
    coco = make_coco(root / "coco", 7, seed=4, empty_fraction=0.0)
    raw = json.loads(coco.ann_file.read_text())
    clean = _dataset(coco, coco.ann_file)
    for index, (segmentation, _) in DAMAGE.items():
        image_id = clean.ids[index]
        image = next(im for im in raw["images"] if im["id"] == image_id)
        ann = next(a for a in raw["annotations"] if a["image_id"] == image_id)
        if isinstance(segmentation, dict):
            segmentation = dict(segmentation, size=[image["height"], image["width"]])
        ann["segmentation"] = segmentation
    bad_file = root / "damaged.json"
    bad_file.write_text(json.dumps(raw))
    return _dataset(coco, bad_file), clean, bad_file


@pytest.mark.parametrize("index", sorted(DAMAGE))
def test_each_bad_segmentation_raises_a_decode_error_naming_it(damaged, index):
    ds, _, bad_file = damaged
    with pytest.raises(DecodeError) as info:
        list(FastLoader(ds, batch_sampler=[[index]], collate_fn=tuple_collate))
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"{bad_file}: the segmentation of image id {ds.ids[index]}'s annotation 0" in msg, msg
    assert DAMAGE[index][1] in msg and f"sample index {index}" in msg and "on_error='skip'" in msg, msg


def test_the_error_reaches_the_parent_from_a_worker(damaged):
    ds, _, _ = damaged
    with pytest.raises(DecodeError, match="image id .* annotation 0"):
        list(FastLoader(ds, batch_size=2, num_workers=2, collate_fn=tuple_collate))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_leaves_the_bad_samples_out_counts_and_logs_them(damaged, num_workers, caplog):
    ds, clean, _ = damaged
    loader = FastLoader(ds, batch_size=3, num_workers=num_workers, collate_fn=tuple_collate, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        got = [(image, target) for images, targets in loader for image, target in zip(images, targets)]
    kept = [i for i in range(len(ds)) if i not in DAMAGE]
    assert [t["image_id"] for _, t in got] == [clean.ids[i] for i in kept]
    for (image, target), i in zip(got, kept):
        ref_image, ref_target = clean[i]
        assert torch.equal(image, ref_image)
        assert torch.equal(target["masks"], ref_target["masks"])
        assert torch.equal(target["boxes"], ref_target["boxes"])
    assert loader.stats()["skipped"] == len(DAMAGE)
    assert all(f"image id {ds.ids[i]}'s annotation 0" in caplog.text for i in DAMAGE), caplog.text


@pytest.mark.parametrize("segmentation", [
    [[1.0, 2.0, 10.0, 12.0, 5.0]],                             # an odd count: 2 points, an empty mask
    [[-10.0, -10.0, 100.0, -5.0, 100.0, 100.0]],               # outside the image
    [[3.0, 3.0, 20.0, 3.0, 20.0, 20.0], [1.0, 2.0]],           # a later polygon of one point
    [[3.0, 3.0, 20.0, 3.0, 20.0, 20.0], []],                   # and an empty one
])
def test_degenerate_polygons_pycocotools_rasterises_keep_its_masks(segmentation):
    from pycocotools import mask as mask_utils

    from gpufeed.sources._coco_masks import CocoPlanes, segmentation_rle

    h, w = 30, 40
    expected = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w)))
    planes = CocoPlanes([segmentation_rle(segmentation, (h, w))], (h, w))
    assert np.array_equal(planes.pixels(np.arange(h), np.arange(w))[0], expected)
    rows, cols = np.arange(0, h, 3), np.arange(1, w, 2)
    assert np.array_equal(planes.pixels(rows, cols)[0], expected[np.ix_(rows, cols)])
