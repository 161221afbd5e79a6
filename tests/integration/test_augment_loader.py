"""Augmentations on the image fast path end to end: the same batches for any num_workers and
row layout, the float ops after normalize, and an exact mid-epoch resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop
from gpufeed.image import augment as A


@pytest.fixture(scope="module")
def root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=6, size=((120, 150), (140, 170)), seed=4)


def _epoch(root: Path, num_workers: int, channels_last: bool = False) -> list[torch.Tensor]:
    transform = RandomResizedCrop(48, ops=(A.TrivialAugmentWide(), A.RandomGrayscale(0.2),
                                           A.TimmAutoAugment("3a")),
                                  float_ops=(A.RandomErasing(0.7, value="random"),))
    loader = FastLoader(ImageFolder(root, transform=transform), batch_size=5,
                        num_workers=num_workers, normalize=((0.5, 0.5, 0.5), (0.2, 0.2, 0.2)),
                        seed=9, channels_last=channels_last, timeout=60)
    assert loader._image_path
    return [images.contiguous() for images, _ in loader]


@pytest.mark.timeout(90)
def test_same_batches_for_any_num_workers(root):
    serial = _epoch(root, 0)
    assert torch.equal(torch.cat(serial), torch.cat(_epoch(root, 2)))
    assert torch.equal(torch.cat(serial), torch.cat(_epoch(root, 2, channels_last=True)))
    # the float ops ran after normalize: erased boxes hold values outside the normalized range
    # of uint8 rows, (0 - 0.5) / 0.2 to (1 - 0.5) / 0.2
    flat = torch.cat(serial)
    assert ((flat < -2.5 - 1e-6) | (flat > 2.5 + 1e-6)).any()


@pytest.mark.timeout(90)
def test_resume_mid_epoch_gives_the_same_augmented_batches(root):
    def make(num_workers: int) -> FastLoader:
        transform = RandomResizedCrop(40, ops=(A.RandAugment(2, 9), A.TimmAutoAugment("3a")),
                                      float_ops=(A.RandomErasing(0.5),))
        return FastLoader(ImageFolder(root, transform=transform), batch_size=4, shuffle=True,
                          num_workers=num_workers, seed=7, dtype=torch.float32,
                          generator=torch.Generator().manual_seed(5), timeout=60)

    full = [images for images, _ in make(0)]
    loader = make(2)
    for i, _ in enumerate(loader):
        if i == 0:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    resumed = make(2)
    resumed.load_state_dict(state)
    rest = [images for images, _ in resumed]
    assert len(rest) == len(full) - 1
    assert all(torch.equal(a, b) for a, b in zip(rest, full[1:]))


def test_float_ops_keep_normalize_in_the_workers_on_the_cuda_path(root):
    """The GPU transform sees whole batches: with float ops, dtype/normalize stay in the workers
    (said once with a GpufeedWarning) and the batch is already float when it crosses PCIe."""
    from gpufeed._fastpath.feed import make_image_feed
    from gpufeed.errors import GpufeedWarning

    transform = RandomResizedCrop(40, float_ops=(A.RandomErasing(0.5),))
    loader = FastLoader(ImageFolder(root, transform=transform), batch_size=4)
    with pytest.warns(GpufeedWarning, match="float ops .*RandomErasing.* run on the normalized rows"):
        feed = make_image_feed(loader, channels_last=False, normalize=((0.5,) * 3, (0.2,) * 3),
                               dtype=None, on_error="raise", cache_budget=0, seed=None, on_gpu=True)
    assert feed is not None and feed.gpu_transform is None
    assert feed.plan.dtype == torch.float32 and feed.plan.normalize is not None
