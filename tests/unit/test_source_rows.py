"""A sample over a sequential JPEG's rows (``JpegRows``): the joint ops give what they give on
the fully decoded image, byte for byte, while a crop's window decodes only down to its bottom
row; an op that needs the whole image decodes it whole; other images decode at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpufeed.decoders import ROW_MARGIN, backends, decode
from gpufeed.image.detection import DetectionPipeline
from gpufeed.image.detection._affine import RandomAffine
from gpufeed.image.detection._crops import RandomCrop, RandomIoUCrop, RandomResizedCrop, RandomZoomOut
from gpufeed.image.detection._geometry import RandomHorizontalFlip, RandomVerticalFlip, Resize
from gpufeed.image.detection._photometric import RandomPhotometricDistort
from gpufeed.image.detection._sample import Boxes, Mask, Sample, sample_rng
from gpufeed.image.detection._source_rows import JpegRows, decode_source, source_sample, source_size
from gpufeed.synth import encode, photo_like

pytestmark = pytest.mark.skipif(not backends()["turbojpeg"]["available"],
                                reason="libturbojpeg not loadable: JPEGs decode whole with OpenCV")

PIPELINES = {
    "rrc+flip": (RandomResizedCrop(64), RandomHorizontalFlip()),
    "ssd": (RandomPhotometricDistort(), RandomZoomOut(fill={"Image": (123, 117, 104), "Mask": 0}),
            RandomIoUCrop(), RandomHorizontalFlip(), Resize((72, 72))),
    "crop+vflip": (RandomCrop(80, padding=6), RandomVerticalFlip()),
    "affine": (RandomAffine(degrees=20, translate=(0.1, 0.1)),),
}


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(90, 200)), int(rng.integers(90, 200))
    return encode(photo_like(h, w, seed=seed, noise=4), quality=90)


def _target(h: int, w: int) -> dict:
    boxes = Boxes(np.array([[w * 0.1, h * 0.2, w * 0.5, h * 0.6], [w * 0.4, h * 0.5, w * 0.9, h * 0.95]]),
                  "XYXY", (h, w))
    plane = (np.arange(h * w) % 5).astype(np.uint8).reshape(1, h, w)
    return {"boxes": boxes, "labels": [1, 2], "masks": Mask(plane)}


def _run(ops: tuple, image: np.ndarray | JpegRows, seed: int) -> tuple:
    pipeline = DetectionPipeline(ops, image_dtype=torch.uint8, scale=False)
    sample = source_sample(image, _target(*source_size(image)))
    return pipeline.output(pipeline.run(sample, sample_rng(seed, 1, 7)))


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_ops_over_rows_equal_ops_over_the_decoded_image(name):
    ops, partial = PIPELINES[name], 0
    for seed in range(30):
        data = _jpeg(seed)
        rows = decode_source(data)
        assert isinstance(rows, JpegRows)
        got, want = _run(ops, rows, seed), _run(ops, decode(data), seed)
        assert _equal(got, want), (name, seed)
        assert rows.decodes <= 2
        partial += rows._valid < rows.shape[0]
    if name in ("rrc+flip", "crop+vflip"):
        assert partial >= 10  # windows ending above the bottom decoded fewer rows
    if name == "affine":
        assert partial == 0  # a warp reads the whole image


def test_rows_decode_on_demand_and_again_only_for_more():
    data = _jpeg(3)
    rows = decode_source(data)
    assert isinstance(rows, JpegRows) and rows.decodes == 0
    full = decode(data)
    rows.rows(0)
    assert rows.decodes == 0
    assert np.array_equal(rows.rows(20)[:20], full[:20]) and rows.decodes == 1
    rows.rows(15)
    assert rows.decodes == 1
    assert np.array_equal(rows.rows(rows.shape[0]), full) and rows.decodes == 2
    assert rows.decode_s > 0


def test_a_window_reads_down_to_its_bottom_row_only():
    data = _jpeg(4)
    rows = decode_source(data)
    h, w = rows.shape[:2]
    sample = Sample.over_rows(rows, {})
    assert sample.size == (h, w) and rows.decodes == 0
    cropped = RandomCrop(40).apply(sample, {"padding": [0, 0, 0, 0], "top": 10, "left": 5,
                                            "crop": True})
    assert rows.decodes == 0  # a crop moves the window
    assert np.array_equal(cropped.image, decode(data)[10:50, 5:45])
    assert rows._valid == 50 < h - ROW_MARGIN


def test_other_images_decode_at_once():
    img = photo_like(40, 50, seed=1)
    progressive = encode(img, quality=90, progressive=True)
    assert isinstance(decode_source(progressive), np.ndarray)
    png = encode(img, fmt="png")
    got = decode_source(png)
    assert isinstance(got, np.ndarray) and np.array_equal(got, img)
