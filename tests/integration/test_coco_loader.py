"""``gpufeed.CocoDetection`` through a ``FastLoader`` with the SSD recipe's joint ops (photometric
distortion, zoom-out, IoU crop, flip, resize, sanitize) and instance masks: the same batches for
any ``num_workers``, across epochs, and after a mid-epoch resume; the masks stay lazy until the
output. No torchvision needed (the ops are gpufeed's)."""

from __future__ import annotations

import pytest
import torch

import gpufeed
from gpufeed._synth_coco import make_coco
from gpufeed.image.detection import DetectionPipeline
from gpufeed.image.detection._boxes import SanitizeBoundingBoxes
from gpufeed.image.detection._crops import RandomIoUCrop, RandomZoomOut
from gpufeed.image.detection._geometry import RandomHorizontalFlip, Resize
from gpufeed.image.detection._photometric import RandomPhotometricDistort
from tests.integration._batches import interrupted
from tests.integration._detection import assert_same

pytestmark = pytest.mark.timeout(180)


def zip_collate(batch):
    return tuple(zip(*batch))


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("coco"), 20, seed=9, empty_fraction=0.0)


def ssd() -> DetectionPipeline:
    return DetectionPipeline(ops=(
        RandomPhotometricDistort(), RandomZoomOut(fill={"Mask": 0}, p=0.7), RandomIoUCrop(),
        RandomHorizontalFlip(), Resize((96, 128)), SanitizeBoundingBoxes()))


def loader(coco, num_workers: int) -> gpufeed.FastLoader:
    dataset = gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=ssd(),
                                    target_keys=["boxes", "labels", "masks", "image_id"])
    return gpufeed.FastLoader(dataset, batch_size=3, shuffle=True, seed=11, num_workers=num_workers,
                              collate_fn=zip_collate, generator=torch.Generator().manual_seed(2))


def epochs(fast: gpufeed.FastLoader, n: int) -> list:
    return [list(fast) for _ in range(n)]


def test_the_batches_are_the_same_for_any_number_of_workers_and_differ_by_epoch(coco):
    want = epochs(loader(coco, 0), 2)
    for num_workers in (1, 3):
        assert_same(epochs(loader(coco, num_workers), 2), want)
    first, second = ([t["image_id"] for _, ts in e for t in ts] for e in want)
    assert sorted(first) == sorted(second)
    # a new epoch draws new parameters: some sample's boxes differ between the epochs
    by_id = [{t["image_id"]: t["boxes"] for _, ts in e for t in ts} for e in want]
    assert any(by_id[0][k].shape != by_id[1][k].shape or not torch.equal(by_id[0][k], by_id[1][k])
               for k in by_id[0])
    images = [img for _, (imgs, _) in enumerate(want[0]) for img in imgs]
    assert {tuple(img.shape) for img in images} == {(3, 96, 128)}
    masks = [t["masks"] for _, ts in want[0] for t in ts]
    assert all(m.shape[1:] == (96, 128) and m.shape[0] == len(t["boxes"])
               for m, t in zip(masks, (t for _, ts in want[0] for t in ts)))


@pytest.mark.parametrize(("before", "after"), [(2, 2), (0, 3)])
def test_mid_epoch_resume_is_exact(coco, before, after):
    full = list(loader(coco, before))
    head, state = interrupted(loader(coco, before), 2)
    assert_same(head, full[:2])
    resumed = loader(coco, after)
    resumed.load_state_dict(state)
    assert_same(list(resumed), full[2:])


def test_reads_ahead_give_the_same_batches(coco):
    def with_reads(read_concurrency):
        dataset = gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=ssd(),
                                        target_keys=["boxes", "labels", "masks", "image_id"],
                                        read_concurrency=read_concurrency)
        return gpufeed.FastLoader(dataset, batch_size=4, shuffle=True, seed=11, num_workers=2,
                                  collate_fn=zip_collate, generator=torch.Generator().manual_seed(2))

    ahead = with_reads(4)
    got = list(ahead)
    assert ahead.stats()["read_concurrency_max"] == 4
    assert_same(got, list(with_reads(1)))
    with pytest.raises(ValueError, match="read_concurrency"):
        gpufeed.CocoDetection(coco.root, coco.ann_file, read_concurrency=0)
