"""ImageBatcher with a CUDA device: page-locked slots, non-blocking copies, normalize on the GPU.

Skipped without CUDA (see conftest.py).
"""

from __future__ import annotations

import threading

import pytest
import torch

from gpufeed import ResizeCenterCrop
from gpufeed.serve import ImageBatcher

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRANSFORM = ResizeCenterCrop(64, 72)


class Recorder:
    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []
        self.lock = threading.Lock()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        assert torch.is_inference_mode_enabled()
        with self.lock:
            self.batches.append(x.clone())
        return x.mean(dim=(1, 2, 3))


def test_cuda_batches_equal_the_cpu_path_and_slots_are_page_locked(image_folder):
    root = image_folder(num_classes=2, per_class=8, seed=2)
    data = [p.read_bytes() for p in sorted(root.rglob("*.jpg"))]
    results = {}
    for device in ("cpu", "cuda"):
        model = Recorder()
        with ImageBatcher(model, transform=TRANSFORM, normalize=(MEAN, STD), device=device, num_workers=2,
                          max_batch_size=len(data), max_delay_ms=500, mp_context="fork") as batcher:
            outputs = [f.result(timeout=120) for f in [batcher.submit(d) for d in data]]
            if device == "cuda":
                assert batcher._context.registrar is not None  # the arena's slots are page-locked
        assert len(model.batches) == 1
        results[device] = (model.batches[0], outputs)
    cpu_batch, cpu_out = results["cpu"]
    gpu_batch, gpu_out = results["cuda"]
    assert gpu_batch.device.type == "cuda" and gpu_batch.dtype == torch.float32
    # the same arithmetic (gpufeed.image._normalize) on both sides
    torch.testing.assert_close(gpu_batch.cpu(), cpu_batch, rtol=0, atol=1e-6)
    for c, g in zip(cpu_out, gpu_out):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), c, rtol=1e-5, atol=1e-5)
