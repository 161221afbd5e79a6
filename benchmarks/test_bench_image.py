"""Image path building blocks, per backend: decode (full and DCT-scaled), crop, resize, the
transforms end to end, and normalizing a uint8 batch to float32.

    .venv/bin/python -m pytest benchmarks/test_bench_image.py --benchmark-only

Images are synthetic and photo-like (gpufeed.synth), JPEG quality 90, 4:2:0: 500x375 is the
typical ImageNet training image; 1200x900 a larger photo. Single thread (cv2.setNumThreads(1)),
as in a worker. Compare rows within a group; each row's extra_info names the backend.

Private import: ``gpufeed.image._normalize`` (``affine``, ``convert_``, ``scale_shift``), the
normalize step it measures.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from gpufeed.decoders import backends, decode, read_header
from gpufeed.image import RandomResizedCrop, ResizeCenterCrop
from gpufeed.image._normalize import affine, convert_, scale_shift
from gpufeed.synth import encode, photo_like

TURBO = backends()["turbojpeg"]["available"]
BACKENDS = [pytest.param("turbojpeg", marks=pytest.mark.skipif(
    not TURBO, reason="libturbojpeg not loadable")), "opencv"]
SIZES = {"500x375": (375, 500), "1200x900": (900, 1200)}
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    yield
    cv2.setNumThreads(previous)


@pytest.fixture(scope="module")
def jpegs():
    return {name: encode(photo_like(h, w, seed=1), quality=90) for name, (h, w) in SIZES.items()}


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_full(benchmark, jpegs, backend, size):
    benchmark.group = f"decode-full-{size}"
    benchmark.extra_info.update(backend=backend, bytes=len(jpegs[size]))
    img = benchmark(decode, jpegs[size], backend=backend)
    assert img.shape[:2] == SIZES[size]


@pytest.mark.parametrize("factor", [2, 4, 8])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_dct_scaled(benchmark, jpegs, backend, factor):
    data = jpegs["1200x900"]
    min_h, min_w = 900 // factor, 1200 // factor
    benchmark.group = "decode-scaled-1200x900"
    benchmark.extra_info.update(backend=backend, factor=f"1/{factor}")
    img = benchmark(decode, data, min_height=min_h, min_width=min_w, backend=backend)
    assert img.shape[:2] == (-(-900 // factor), -(-1200 // factor))


def test_read_header(benchmark, jpegs):
    benchmark.group = "header"
    header = benchmark(read_header, jpegs["500x375"])
    assert header.width == 500


@pytest.mark.parametrize("mode", ["area", "linear"])
@pytest.mark.parametrize("region", ["full", "crop"])
def test_resize_to_224(benchmark, mode, region):
    img = photo_like(375, 500, seed=2)
    src = img if region == "full" else img[40:340, 60:420]  # a 300x360 crop, as RRC gives
    out = np.empty((224, 224, 3), np.uint8)
    interp = cv2.INTER_AREA if mode == "area" else cv2.INTER_LINEAR
    benchmark.group = "resize-to-224"
    benchmark.extra_info.update(interpolation=mode, source=f"{src.shape[1]}x{src.shape[0]}")
    benchmark(cv2.resize, src, (224, 224), dst=out, interpolation=interp)


def test_crop_copy(benchmark):
    img = photo_like(375, 500, seed=2)
    benchmark.group = "crop"
    out = benchmark(lambda: np.ascontiguousarray(img[40:340, 60:420]))
    assert out.shape == (300, 360, 3)


def test_rrc_params(benchmark):
    t = RandomResizedCrop(224)
    benchmark.group = "crop"
    counter = iter(range(10**9))
    benchmark(lambda: t.params(0, 1, next(counter), 375, 500))


@pytest.mark.parametrize("interpolation", ["auto", "area"])
@pytest.mark.parametrize("layout", ["hwc", "chw"])
@pytest.mark.parametrize("name", ["RandomResizedCrop", "ResizeCenterCrop"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_transform_apply(benchmark, jpegs, backend, name, layout, interpolation):
    data = jpegs["500x375"]
    kwargs = dict(backend=backend, interpolation=interpolation)
    t = (RandomResizedCrop(224, **kwargs) if name == "RandomResizedCrop"
         else ResizeCenterCrop(224, 256, **kwargs))
    out = np.empty((224, 224, 3) if layout == "hwc" else (3, 224, 224), np.uint8)
    counter = iter(range(10**9))
    benchmark.group = f"transform-500x375-{name}"
    benchmark.extra_info.update(backend=backend, layout=layout, interpolation=interpolation)
    benchmark(lambda: t.apply(data, index=next(counter), epoch=0, seed=0, out=out))


def _jpeg_layout(img: np.ndarray, layout: str) -> bytes:
    """Quality-90 JPEG of an RGB image: "420", "440" (4:4:0: chroma halved vertically) or "gray"."""
    if layout == "gray":
        return encode(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), quality=90)
    if layout == "420":
        return encode(img, quality=90)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440])
    assert ok
    return buf.tobytes()


@pytest.mark.skipif(not TURBO, reason="libturbojpeg not loadable")
@pytest.mark.parametrize("path", ["rgb", "planes"])
@pytest.mark.parametrize("layout", ["420", "440", "gray"])
@pytest.mark.parametrize("name", ["RandomResizedCrop", "ResizeCenterCrop"])
def test_transform_apply_rgb_vs_planes(benchmark, name, layout, path):
    """apply through the RGB path (decode to RGB, one resize) vs the plane path (decode to
    Y/Cb/Cr, resize each plane, convert colour at 224x224). apply's own choice ("auto") is in
    extra_info: planes for 4:4:0 and greyscale, RGB for 4:2:0."""
    data = _jpeg_layout(photo_like(375, 500, seed=1), layout)
    t = RandomResizedCrop(224) if name == "RandomResizedCrop" else ResizeCenterCrop(224, 256)
    out = np.empty((3, 224, 224), np.uint8)
    counter = iter(range(10**9))
    benchmark.group = f"transform-path-500x375-{name}-{layout}"
    benchmark.extra_info.update(path=path, layout=layout, layout_out="chw",
                                auto="rgb" if layout == "420" else "planes")
    benchmark(lambda: t._apply(data, next(counter), 0, 0, out, path=path))


@pytest.mark.parametrize("interpolation", ["auto", "area"])
@pytest.mark.parametrize("dct", [True, False])
def test_transform_dct_scaling_effect(benchmark, jpegs, dct, interpolation):
    data = jpegs["1200x900"]
    t = ResizeCenterCrop(224, 256, dct_scaling=dct, interpolation=interpolation)
    out = np.empty((224, 224, 3), np.uint8)
    benchmark.group = "transform-1200x900-ResizeCenterCrop"
    benchmark.extra_info.update(dct_scaling=dct, interpolation=interpolation)
    benchmark(t.apply, data, out=out)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(64, 3, 224, 224), dtype=np.uint8)


def test_normalize_numpy(benchmark, batch):
    scale, shift = (np.array(v, np.float32).reshape(1, 3, 1, 1) for v in scale_shift((MEAN, STD)))
    out = np.empty(batch.shape, np.float32)

    def normalize():
        np.multiply(batch, scale, out=out)
        return np.add(out, shift, out=out)

    benchmark.group = "normalize-64x3x224x224"
    benchmark.extra_info.update(library="numpy")
    result = benchmark(normalize)
    ref = (batch[0, 0, 0, 0] / 255 - MEAN[0]) / STD[0]
    assert abs(result[0, 0, 0, 0] - ref) < 1e-5


@pytest.mark.parametrize("threads", [1, 2])
def test_normalize_torch(benchmark, batch, threads):
    x = torch.from_numpy(batch)
    constants = affine((MEAN, STD), torch.float32)  # what the image fill uses
    out = torch.empty(x.shape, dtype=torch.float32)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)

    def normalize():
        return convert_(out, x, constants)

    benchmark.group = "normalize-64x3x224x224"
    benchmark.extra_info.update(library="torch", threads=threads)
    try:
        result = benchmark(normalize)
    finally:
        torch.set_num_threads(previous)
    ref = (batch[0, 0, 0, 0] / 255 - MEAN[0]) / STD[0]
    assert abs(float(result[0, 0, 0, 0]) - ref) < 1e-5
