"""A TorchvisionPipeline dataset in FastLoader, in the main process and with workers."""

from __future__ import annotations

import pytest
import torch

from gpufeed import (
    FastLoader,
    ImageFolder,
    ResizeCenterCrop,
)
from tests.unit.test_torchvision_pipeline import (
    MEAN,
    STD,
    pipeline,
    root,  # noqa: F401 (fixtures, used by name)
)


@pytest.mark.timeout(120)
def test_dataset_items_are_normalized_floats_and_the_loader_batches_the_same(root):
    ds = ImageFolder(root, transform=pipeline())
    raw = ImageFolder(root, transform=ResizeCenterCrop(32, 40))
    x, label = ds[3]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32) and label == raw[3][1]
    want = (raw[3][0].float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    torch.testing.assert_close(x, want, rtol=0, atol=1e-5)
    for workers in (0, 2):
        images, labels = next(iter(FastLoader(ds, batch_size=8, num_workers=workers)))
        torch.testing.assert_close(images, torch.stack([ds[i][0] for i in range(8)]), rtol=0, atol=0)
        assert labels.tolist() == [ds[i][1] for i in range(8)]
