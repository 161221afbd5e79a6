"""gpufeed's CocoDetection and SegmentationDataset return what torchvision's CocoDetection and
VOCSegmentation wrapped by ``wrap_dataset_for_transforms_v2`` return: the same PIL pixels, the
same target keys in the same order, the same tv_tensor types, boxes, masks and labels exactly,
for every sample of generated sets. Needs torchvision and pycocotools (.venv-tv)."""

from __future__ import annotations

import json

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")
pytest.importorskip("pycocotools", reason="pycocotools is a dependency of gpufeed")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from torchvision import datasets, tv_tensors  # noqa: E402

from gpufeed import CocoDetection, SegmentationDataset  # noqa: E402
from gpufeed._synth_coco import make_coco, make_segmentation  # noqa: E402
from gpufeed.image.detection import DetectionPipeline  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    synth = make_coco(tmp_path_factory.mktemp("coco"), 48, seed=11, crowd_fraction=0.15,
                      string_rle_fraction=0.1, empty_fraction=0.15, int_box_fraction=0.2)
    raw = json.loads(synth.ann_file.read_text())
    with_anns = {a["image_id"] for a in raw["annotations"]}
    assert len(with_anns) < len(raw["images"])  # some images have no annotation
    kinds = {(type(a["segmentation"]).__name__, a["iscrowd"]) for a in raw["annotations"]}
    assert {("list", 0), ("dict", 0), ("dict", 1)} <= kinds
    assert any(all(isinstance(v, int) for v in a["bbox"]) for a in raw["annotations"])
    return synth


def _wrapped(coco, target_keys, **kwargs):
    return datasets.wrap_dataset_for_transforms_v2(
        datasets.CocoDetection(str(coco.root), str(coco.ann_file), **kwargs), target_keys=target_keys)


def assert_same(ours, theirs, path="sample"):
    assert type(ours) is type(theirs), f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, path
        assert torch.equal(ours.as_subclass(torch.Tensor), theirs.as_subclass(torch.Tensor)), path
        if isinstance(theirs, tv_tensors.BoundingBoxes):
            assert ours.format == theirs.format, path
            assert tuple(ours.canvas_size) == tuple(theirs.canvas_size), path
            assert ours.clamping_mode == theirs.clamping_mode, path
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), path
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{k}]")
    elif hasattr(theirs, "mode") and hasattr(theirs, "size"):  # a PIL image
        assert ours.mode == theirs.mode and ours.size == theirs.size, path
        assert np.array_equal(np.asarray(ours), np.asarray(theirs)), path
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


@pytest.mark.parametrize("target_keys", [None, ["boxes", "labels", "masks"], "all"],
                         ids=["default", "boxes-labels-masks", "all"])
def test_every_sample_equals_the_wrapped_torchvision_dataset(coco, target_keys):
    theirs = _wrapped(coco, target_keys)
    ours = CocoDetection(coco.root, coco.ann_file, target_keys=target_keys)
    assert len(ours) == len(theirs) and ours.ids == theirs.ids
    for i in range(len(ours)):
        assert_same(ours[i], theirs[i], f"sample {i}")


def test_a_torchvision_pipeline_given_as_transforms_runs_as_on_the_wrapped_dataset(coco):
    pipeline = V.Compose([V.RandomHorizontalFlip(p=1.0), V.ToImage(), V.Resize((96, 128))])
    theirs = _wrapped(coco, ["boxes", "labels", "masks"], transforms=pipeline)
    ours = CocoDetection(coco.root, coco.ann_file, transforms=pipeline,
                         target_keys=["boxes", "labels", "masks"])
    for i in range(0, len(ours), 3):
        assert_same(ours[i], theirs[i], f"sample {i}")


def test_transform_and_target_transform_apply_to_the_image_and_the_target(coco):
    def target_transform(target):
        return sorted(target)

    theirs = _wrapped(coco, "all", transform=V.PILToTensor(), target_transform=target_transform)
    ours = CocoDetection(coco.root, coco.ann_file, V.PILToTensor(), target_transform, target_keys="all")
    for i in range(0, len(ours), 5):
        assert_same(ours[i], theirs[i], f"sample {i}")


def test_the_gpufeed_pipeline_path_gives_the_same_target_and_nearly_the_same_pixels(coco):
    theirs = _wrapped(coco, ["boxes", "labels", "masks"], transforms=V.ToImage())
    ours = CocoDetection(coco.root, coco.ann_file, target_keys=["boxes", "labels", "masks"],
                         transforms=DetectionPipeline(image_dtype=torch.uint8, pure=False))
    for i in range(len(ours)):
        (image, target), (their_image, their_target) = ours[i], theirs[i]
        assert_same(target, their_target, f"target {i}")
        assert isinstance(image, tv_tensors.Image) and image.shape == their_image.shape
        diff = (image.int() - their_image.int()).abs()
        assert diff.max() <= 2 and diff.float().mean() < 0.1, f"sample {i}: decoders differ"


def test_segmentation_equals_the_wrapped_voc_segmentation(tmp_path):
    seg = make_segmentation(tmp_path, 10, seed=5)

    class Pairs(datasets.VOCSegmentation):  # VOCSegmentation's __getitem__ on our file lists
        def __init__(self, images, masks, **kwargs):
            datasets.VisionDataset.__init__(self, str(tmp_path), **kwargs)
            self.images, self.targets = images, masks

    images, masks = [str(p) for p in seg.image_paths], [str(p) for p in seg.mask_paths]
    theirs = datasets.wrap_dataset_for_transforms_v2(Pairs(images, masks))
    for ours in (SegmentationDataset(seg.images, seg.masks), SegmentationDataset(images, masks)):
        assert len(ours) == len(theirs)
        for i in range(len(ours)):
            assert_same(ours[i], theirs[i], f"sample {i}")
    flip = V.Compose([V.RandomHorizontalFlip(p=1.0), V.PILToTensor()])
    theirs = datasets.wrap_dataset_for_transforms_v2(Pairs(images, masks, transforms=flip))
    ours = SegmentationDataset(images, masks, flip)
    for i in range(len(ours)):
        assert_same(ours[i], theirs[i], f"sample {i}")
    piped = SegmentationDataset(images, masks, DetectionPipeline(image_dtype=torch.uint8, pure=False))
    for i in range(len(ours)):
        _, mask = piped[i]
        assert_same(mask, datasets.wrap_dataset_for_transforms_v2(Pairs(images, masks))[i][1])
