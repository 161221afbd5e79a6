"""The per-sample path (detection and segmentation) with ``device="cuda"``: every tensor of the
user's collate's batch (lists of images of different sizes, target dicts, stacked images and
segmentation masks) arrives on the GPU equal to the CPU loader's batch, held batches stay intact while the
slots are reused, and a Subset of the dataset behaves the same.

Skipped without CUDA (see conftest.py). No torchvision needed: gpufeed's own joint ops.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Subset

import gpufeed
from gpufeed._synth_coco import make_coco, make_segmentation
from gpufeed.cuda._feed import map_tensors
from gpufeed.image.detection import DetectionPipeline
from gpufeed.image.detection._crops import RandomIoUCrop, RandomResizedCrop
from gpufeed.image.detection._geometry import RandomHorizontalFlip, Resize

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]


def zip_collate(batch):
    return tuple(zip(*batch))


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    # no compressed RLEs, no mask targets: the GPU machine may lack pycocotools
    return make_coco(tmp_path_factory.mktemp("coco"), 24, seed=3, empty_fraction=0.0, string_rle_fraction=0.0)


@pytest.fixture(scope="module")
def seg(tmp_path_factory):
    return make_segmentation(tmp_path_factory.mktemp("seg"), 24, seed=3)


def _coco_dataset(coco, resize: bool) -> gpufeed.CocoDetection:
    ops = (RandomIoUCrop(), RandomHorizontalFlip(), *((Resize((96, 128)),) if resize else ()))
    return gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=DetectionPipeline(ops=ops),
                                 target_keys=["boxes", "labels", "image_id"])  # masks need pycocotools


def _epoch(dataset, device, **kw) -> list:
    loader = gpufeed.FastLoader(dataset, batch_size=4, num_workers=2, seed=7, device=device, **kw)
    assert loader.stats()["path"] == "image"
    return list(loader)


def _assert_on_gpu_and_equal(gpu_batches: list, cpu_batches: list) -> None:
    torch.cuda.synchronize()
    assert len(gpu_batches) == len(cpu_batches)
    for got, want in zip(gpu_batches, cpu_batches):
        assert _devices(got) == {"cuda"}
        on_cpu = map_tensors(got, lambda t: t.cpu())
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        _pair_leaves(on_cpu, want, pairs)
        assert all(g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w) for g, w in pairs)


def _devices(batch) -> set[str]:
    found: set[str] = set()
    map_tensors(batch, lambda t: found.add(t.device.type) or t)
    return found


def _pair_leaves(got, want, out) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        out.append((got, want))
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _pair_leaves(got[key], want[key], out)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _pair_leaves(g, w, out)
    else:
        assert got == want


@pytest.mark.parametrize("resize", [False, True], ids=["variable-size", "fixed-size"])
def test_detection_batches_arrive_on_the_gpu_equal_to_the_cpu_loaders(coco, resize):
    cpu = _epoch(_coco_dataset(coco, resize), None, collate_fn=zip_collate)
    gpu = _epoch(_coco_dataset(coco, resize), "cuda", collate_fn=zip_collate, prefetch_batches=3)
    _assert_on_gpu_and_equal(gpu, cpu)  # held for the whole epoch: slots reused meanwhile


def test_segmentation_default_collate_stacks_on_the_gpu(seg):
    def dataset():
        ops = (RandomResizedCrop((64, 64)), RandomHorizontalFlip())
        return gpufeed.SegmentationDataset(seg.images, seg.masks, transforms=DetectionPipeline(ops=ops))

    cpu = _epoch(dataset(), None)
    gpu = _epoch(dataset(), "cuda")
    _assert_on_gpu_and_equal(gpu, cpu)
    images, masks = gpu[0]
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.float32 and masks.shape[-2:] == (64, 64)


def test_a_subset_through_the_gpu_gives_the_base_datasets_samples(coco):
    keep = [5, 0, 17, 3, 9, 11, 2, 20]
    cpu = _epoch(_coco_dataset(coco, True), None, collate_fn=zip_collate, sampler=keep)
    gpu = _epoch(Subset(_coco_dataset(coco, True), keep), "cuda", collate_fn=zip_collate)
    _assert_on_gpu_and_equal(gpu, cpu)
