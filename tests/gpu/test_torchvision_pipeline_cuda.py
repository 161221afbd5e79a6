"""A translated torchvision pipeline with ``device="cuda"``: its Normalize and dtype run on the
GPU and give the CPU path's values. The pipeline is built directly (no torchvision needed);
tests/torchvision checks the translation itself. Skipped without CUDA (see conftest.py)."""

from __future__ import annotations

import pytest
import torch

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, TorchvisionPipeline

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_pipeline_normalize_runs_on_the_gpu_with_the_cpu_values(image_folder):
    root = image_folder(num_classes=2, per_class=8, size=((60, 90), (60, 90)), seed=2)
    pipe = TorchvisionPipeline(RandomResizedCrop(48), output="float", dtype=torch.float32,
                               normalize=(MEAN, STD), routes=(), source="test")
    ds = ImageFolder(root, transform=pipe)
    cpu = list(FastLoader(ds, batch_size=4, num_workers=2, seed=3))
    gpu = list(FastLoader(ds, batch_size=4, num_workers=2, seed=3, device="cuda"))
    assert len(cpu) == len(gpu) == 4
    for (ci, cl), (gi, gl) in zip(cpu, gpu):
        assert gi.device.type == "cuda" and gi.dtype == torch.float32 and gi.shape == (4, 3, 48, 48)
        torch.testing.assert_close(gi.cpu(), ci, rtol=1e-5, atol=1e-5)
        assert torch.equal(gl.cpu(), cl)
    with pytest.raises(ValueError, match="normalized twice"):
        FastLoader(ds, batch_size=4, device="cuda", normalize=(MEAN, STD))
