"""Through the loader: ``FastLoader(gpufeed.CocoDetection(..., transforms=T))`` against
``DataLoader(wrap_dataset_for_transforms_v2(torchvision CocoDetection(..., transforms=T)))``
with the same deterministic v2 pipeline ``T`` and the same collate: 0 box, mask, label or id
mismatches (boxes within 1e-3 px, masks and labels exactly), images within the resampling
tolerance, every sample of a generated COCO set. Needs torchvision and pycocotools."""

from __future__ import annotations

import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision import datasets, tv_tensors  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed._synth_coco import make_coco  # noqa: E402

pytestmark = pytest.mark.timeout(300)

KEYS = ["image_id", "boxes", "labels", "masks"]


def collate(batch):
    return tuple(zip(*batch))


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("coco"), 40, seed=5, empty_fraction=0.0,
                     crowd_fraction=0.15, string_rle_fraction=0.1, int_box_fraction=0.0)


def _pipelines():
    flip_resize = V.Compose([V.RandomHorizontalFlip(p=1.0), V.Resize((200, 256)), V.ToImage(),
                             V.ToDtype(torch.float32, scale=True), V.ToPureTensor()])
    formats = V.Compose([V.ToImage(), V.RandomVerticalFlip(p=1.0), V.Resize(224, max_size=300),
                         V.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.CXCYWH),
                         V.ClampBoundingBoxes(), V.SanitizeBoundingBoxes(min_size=2.0),
                         V.ToDtype(torch.float32, scale=True), V.ToPureTensor()])
    pad_crop = V.Compose([V.Pad([7, 3, 11, 5]), V.CenterCrop((180, 220)), V.ToImage(),
                          V.ToDtype(torch.float32, scale=True)])
    # v2 containers whose draws leave one outcome: gpufeed's containers of joint ops
    containers = V.Compose([
        V.RandomApply([V.RandomHorizontalFlip(p=1.0), V.Resize((200, 256))], p=1.0),
        V.RandomChoice([V.Compose([V.Pad([7, 3, 11, 5]), V.CenterCrop((180, 220))])]),
        V.RandomOrder([V.RandomVerticalFlip(p=1.0), V.Identity()]),
        V.ToImage(), V.ToDtype(torch.float32, scale=True), V.ToPureTensor()])
    # before the conversion torchvision resizes the PIL image: PIL's nearest pixels, always antialiased
    pil_stage = V.Compose([V.Resize((150, 190), interpolation=V.InterpolationMode.NEAREST),
                           V.RandomHorizontalFlip(p=1.0), V.Resize(97, antialias=False), V.ToImage(),
                           V.ToDtype(torch.float32, scale=True), V.ToPureTensor()])
    # ... and warps it with PIL's affine transform (a quarter turn of a non-square image without
    # expand is not one of PIL's shortcuts: its fixed-point steps pick other pixels than torch's grid)
    pil_warps = V.Compose([V.RandomRotation((90, 90)), V.RandomAffine((15, 15), scale=(1.25, 1.25), shear=(8, 8, 0, 0)),
                           V.RandomRotation((-20, -20), expand=True, fill={tv_tensors.Image: (9, 8, 7), "others": 0}),
                           V.ToImage(), V.ToDtype(torch.float32, scale=True)])
    return {"flip_resize": flip_resize, "formats": formats, "pad_crop": pad_crop, "containers": containers,
            "pil_stage": pil_stage, "pil_warps": pil_warps}


@pytest.mark.parametrize("name", sorted(_pipelines()))
def test_loader_batches_match_torchvisions_wrapped_coco(coco, name):
    pipeline = _pipelines()[name]
    ours = gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=pipeline,
                                 target_keys=KEYS)
    assert isinstance(ours.transforms, gpufeed.image.detection.DetectionPipeline)
    theirs = datasets.wrap_dataset_for_transforms_v2(
        datasets.CocoDetection(coco.root, coco.ann_file, transforms=pipeline),
        target_keys=KEYS)
    fast = gpufeed.FastLoader(ours, batch_size=4, num_workers=2, collate_fn=collate)
    assert fast.stats()["path"] == "image"
    ref = DataLoader(theirs, batch_size=4, num_workers=0, collate_fn=collate)
    assert _compare(fast, ref) == len(theirs)


def _with_annotations(dataset):
    """The detection references' ``_coco_remove_images_without_annotations``: a Subset of the
    images with annotations, found through ``dataset.coco``."""
    keep = [k for k, image_id in enumerate(dataset.ids)
            if dataset.coco.loadAnns(dataset.coco.getAnnIds(imgIds=image_id, iscrowd=None))]
    return torch.utils.data.Subset(dataset, keep)


def test_the_references_subset_and_aspect_groups_give_torchvisions_batches(tmp_path):
    """The references' training set (a Subset without the images that have no annotation) and
    aspect-ratio groups (torchvision's CocoDetection answers from ``coco.imgs``, gpufeed's from
    ``get_height_and_width``): the same Subset, the same groups, the same batches."""
    data = make_coco(tmp_path, 30, seed=6, empty_fraction=0.3, int_box_fraction=0.0)
    pipeline = _pipelines()["flip_resize"]
    ours = _with_annotations(gpufeed.CocoDetection(data.root, data.ann_file, transforms=pipeline,
                                                   target_keys=KEYS))
    theirs = _with_annotations(datasets.wrap_dataset_for_transforms_v2(
        datasets.CocoDetection(data.root, data.ann_file, transforms=pipeline), target_keys=KEYS))
    assert ours.indices == theirs.indices and 0 < len(ours) < 30
    info = theirs.dataset.coco.imgs
    tv_wide = [info[theirs.dataset.ids[i]]["width"] > info[theirs.dataset.ids[i]]["height"]
               for i in theirs.indices]
    wide = [w > h for h, w in (ours.dataset.get_height_and_width(i) for i in ours.indices)]
    assert wide == tv_wide
    groups = ([i for i, w in enumerate(wide) if w], [i for i, w in enumerate(wide) if not w])
    batches = [group[k:k + 3] for group in groups for k in range(0, len(group), 3)]
    fast = gpufeed.FastLoader(ours, batch_sampler=batches, num_workers=2, collate_fn=collate)
    assert fast.stats()["path"] == "image"
    assert _compare(fast, DataLoader(theirs, batch_sampler=batches, collate_fn=collate)) == len(ours)


def _compare(fast, ref) -> int:
    """Compare the two loaders' batches as the module docstring says; returns the sample count."""
    mismatches: list[str] = []
    diffs = []
    count = 0
    for (imgs, targets), (ref_imgs, ref_targets) in zip(fast, ref, strict=True):
        for img, t, ref_img, rt in zip(imgs, targets, ref_imgs, ref_targets, strict=True):
            count += 1
            where = f"image_id {rt['image_id']}"
            if list(t) != list(rt):
                mismatches.append(f"{where}: keys {list(t)} != {list(rt)}")
                continue
            if t["image_id"] != rt["image_id"]:
                mismatches.append(f"{where}: image_id {t['image_id']}")
            if t["boxes"].shape != rt["boxes"].shape or not torch.allclose(
                    t["boxes"].float(), rt["boxes"].float(), atol=1e-3, rtol=0):
                mismatches.append(f"{where}: boxes")
            if not torch.equal(t["labels"], rt["labels"]):
                mismatches.append(f"{where}: labels")
            if not torch.equal(torch.as_tensor(t["masks"]), torch.as_tensor(rt["masks"])):
                mismatches.append(f"{where}: masks")
            if type(t["boxes"]) is not type(rt["boxes"]) or type(t["masks"]) is not type(rt["masks"]):
                mismatches.append(f"{where}: types {type(t['boxes'])}, {type(t['masks'])}")
            if img.shape != ref_img.shape or img.dtype != ref_img.dtype:
                mismatches.append(f"{where}: image {tuple(img.shape)} {img.dtype}")
            else:
                diffs.append(float((img.float() - ref_img.float()).abs().mean()) * 255)
    assert mismatches == []
    # gpufeed decodes with libjpeg-turbo/OpenCV and resizes with OpenCV; torchvision with PIL:
    # the existing tolerance for a bilinear resize (1.5 levels) plus the decoders' difference.
    assert max(diffs) < 2.5, diffs
    return count
