"""Every output layout and dtype: the batch conversion alone, and a whole batch filled by a worker.

    .venv/bin/python -m pytest benchmarks/test_bench_layouts.py --benchmark-only

``convert-64x224x224``: uint8 rows to float (``gpufeed.image._normalize.convert_``) with ImageNet
normalize, per (layout, dtype), one thread, as in a worker. ``fill-16x500x375-eval``: what a
worker does for a batch (decode 16 photo-like 500x375 JPEGs, Resize(256)+CenterCrop(224) into
the rows, convert) per (layout, dtype), uint8 included. The goal: every combination
within 5% of NCHW float32; compare rows within a group.

Private imports: ``gpufeed.image._fill`` (``ImagePlan``, ``ImageTask``, ``fill_batch``: a worker's
batch fill) and ``gpufeed.image._normalize``, the steps it measures.
"""

from __future__ import annotations

import cv2
import pytest
import torch

from gpufeed.image import ResizeCenterCrop
from gpufeed.image._fill import ImagePlan, ImageTask, fill_batch
from gpufeed.image._normalize import affine, convert_, work_dtype
from gpufeed.sources import ImageDataset
from gpufeed.synth import encode, photo_like

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = {"nchw": False, "channels_last": True}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = cv2.getNumThreads(), torch.get_num_threads()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    yield
    cv2.setNumThreads(previous[0])
    torch.set_num_threads(previous[1])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_convert(benchmark, layout, dtype):
    fmt = torch.channels_last if LAYOUTS[layout] else torch.contiguous_format
    images = torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8).contiguous(memory_format=fmt)
    out = torch.empty(images.shape, dtype=dtype).contiguous(memory_format=fmt)
    constants = affine((MEAN, STD), work_dtype(dtype))
    benchmark.group = "convert-64x224x224"
    benchmark.extra_info.update(layout=layout, dtype=str(dtype))
    result = benchmark(convert_, out, images, constants)
    want = (images[:1].float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(result[:1].float(), want, atol=4 * torch.finfo(dtype).eps * 3, rtol=0)


@pytest.fixture(scope="module")
def source():
    items = [(encode(photo_like(375, 500, seed=i), quality=90), i % 2) for i in range(16)]
    return ImageDataset(items)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.uint8, *FLOATS], ids=str)
def test_fill_batch(benchmark, source, layout, dtype):
    plan = ImagePlan(transform=ResizeCenterCrop(224, 256), channels_last=LAYOUTS[layout],
                     normalize=None if dtype == torch.uint8 else (MEAN, STD), dtype=dtype)
    n = len(source)
    buf = torch.empty(plan.layout(n).staging, dtype=torch.uint8)
    indices = list(range(n))

    def fill():
        return fill_batch(plan, source, indices, ImageTask(epoch=0), lambda: buf, None)

    benchmark.group = "fill-16x500x375-eval"
    benchmark.extra_info.update(layout=layout, dtype=str(dtype))
    (images, labels), report = benchmark(fill)
    assert images.shape == (n, 3, 224, 224) and images.dtype == dtype and report.samples == n
    assert images.is_contiguous(memory_format=torch.channels_last if LAYOUTS[layout] else torch.contiguous_format)
