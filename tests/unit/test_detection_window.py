"""The lazy image window (``ImageWindow``): constant pads, crops (also into the fill) and flips
compose a window over the source and the first read of ``Sample.image`` materialises it. The
pixels equal the eager path's (a numpy reference, and reading the image after every op) byte for
byte, and no array larger than the final window is allocated on the way (tracemalloc)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from gpufeed.image.detection._crops import Pad, RandomIoUCrop, RandomZoomOut, window_sample
from gpufeed.image.detection._geometry import (
    RandomHorizontalFlip,
    RandomVerticalFlip,
    _torch_resize,
    flip_sample,
    resize_sample,
    resize_window,
)
from gpufeed.image.detection._sample import Boxes, ImageWindow, Mask, Sample, sample_rng

MEAN = (123, 117, 104)


def ref_window(img: np.ndarray, top: int, left: int, h: int, w: int, fill: tuple[int, ...]) -> np.ndarray:
    """Window (top, left, h, w) of ``img`` with ``fill`` outside it, in plain numpy."""
    out = np.empty((h, w, 3), np.uint8)
    out[:] = fill
    ih, iw = img.shape[:2]
    y0, y1, x0, x1 = max(top, 0), min(top + h, ih), max(left, 0), min(left + w, iw)
    if y0 < y1 and x0 < x1:
        out[y0 - top:y1 - top, x0 - left:x1 - left] = img[y0:y1, x0:x1]
    return out


def make_sample(rng: np.random.Generator, h: int, w: int) -> Sample:
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    n = int(rng.integers(1, 5))
    xy = rng.uniform(0, 0.6, (n, 2)) * [w, h]
    wh = rng.uniform(0.1, 0.4, (n, 2)) * [w, h]
    boxes = Boxes(np.concatenate([xy, xy + wh], axis=1), "XYXY", (h, w))
    masks = Mask((rng.random((n, h, w)) < 0.5).astype(np.uint8))
    return Sample(image, {"boxes": boxes, "masks": masks, "labels": list(range(n))})


SSD = [RandomZoomOut(fill={"Image": MEAN, "Mask": 0}), RandomIoUCrop(), RandomHorizontalFlip(),
       RandomVerticalFlip()]


@pytest.mark.parametrize("seed", range(60))
def test_ssd_chain_equals_eager(seed: int) -> None:
    h, w = 20 + seed % 47, 70 - seed % 31
    rng = np.random.default_rng(seed)
    lazy, eager = make_sample(rng, h, w), make_sample(np.random.default_rng(seed), h, w)
    ref = lazy.image.copy()
    draws = sample_rng(seed, 0, 1)
    for op in SSD:
        params = op.draw(draws, lazy)
        if params is None:
            continue
        lazy = op.apply(lazy, params)
        eager = op.apply(eager, params)
        assert eager.image.shape[:2] == lazy.size  # read after every op: the eager path
        if isinstance(op, RandomZoomOut):
            left, top, right, bottom = params["padding"]
            ref = ref_window(ref, -top, -left, ref.shape[0] + top + bottom, ref.shape[1] + left + right, MEAN)
        elif isinstance(op, RandomIoUCrop):
            ref = ref_window(ref, params["top"], params["left"], params["height"], params["width"], MEAN)
        else:
            ref = ref[:, ::-1] if isinstance(op, RandomHorizontalFlip) else ref[::-1]
        assert lazy.size == ref.shape[:2]
    got = lazy.image
    assert isinstance(got, np.ndarray) and got.dtype == np.uint8
    assert got.tobytes() == np.ascontiguousarray(ref).tobytes()
    assert eager.image.tobytes() == got.tobytes()
    assert lazy.target["masks"].dense().tobytes() == eager.target["masks"].dense().tobytes()


@pytest.mark.parametrize("seed", range(200))
def test_random_windows_into_the_fill(seed: int) -> None:
    """Crops anywhere (inside, across and beyond the margins), pads of two fills and flips."""
    rng = np.random.default_rng(1000 + seed)
    src = rng.integers(0, 256, (int(rng.integers(1, 30)), int(rng.integers(1, 30)), 3), dtype=np.uint8)
    sample, ref = Sample(src, {}), src
    fills = [(0, 0, 0), MEAN]
    for _ in range(int(rng.integers(1, 7))):
        kind = int(rng.integers(4))
        if kind == 2:
            sample, ref = flip_sample(sample, True), ref[:, ::-1]
        elif kind == 3:
            sample, ref = flip_sample(sample, False), ref[::-1]
        else:
            h, w = ref.shape[:2]
            ch, cw = int(rng.integers(1, 2 * h + 5)), int(rng.integers(1, 2 * w + 5))
            top, left = int(rng.integers(-ch - 3, h + 3)), int(rng.integers(-cw - 3, w + 3))
            fill = fills[int(rng.integers(2))]
            sample = window_sample(sample, top, left, ch, cw, fill, mask_fill=0)
            ref = ref_window(ref, top, left, ch, cw, fill)
        assert sample.size == ref.shape[:2]
        if rng.random() < 0.15:
            assert sample.image.shape[:2] == sample.size  # a read in between changes nothing
    assert sample.image.tobytes() == np.ascontiguousarray(ref).tobytes()


def test_window_allocates_no_canvas() -> None:
    """A 4x zoom-out and a crop into it allocate the crop's bytes, not the canvas's."""
    src = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    sample = Sample(src, {"boxes": Boxes(np.array([[10.0, 10.0, 100.0, 90.0]]), "XYXY", (300, 400))})
    zoom, crop = RandomZoomOut(fill={"Image": MEAN, "Mask": 0}), RandomIoUCrop()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        sample = zoom.apply(sample, {"padding": [700, 500, 500, 400]})  # canvas 1200 x 1600
        assert sample.size == (1200, 1600)
        sample = crop.apply(sample, {"top": 300, "left": 500, "height": 360, "width": 480,
                                     "inside": np.array([True])})  # into the fill and the image
        sample = flip_sample(sample, True)
        image = sample.image
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert image.shape == (360, 480, 3)
    assert peak < image.nbytes + 64 * 1024 < 1200 * 1600 * 3
    ref = ref_window(ref_window(src, -500, -700, 1200, 1600, MEAN), 300, 500, 360, 480, MEAN)[:, ::-1]
    assert image.tobytes() == np.ascontiguousarray(ref).tobytes()


def test_window_inside_the_source_is_a_view() -> None:
    src = np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    out = window_sample(Sample(src, {}), 5, 6, 20, 30).image
    assert np.shares_memory(out, src) and np.array_equal(out, src[5:25, 6:36])


def test_size_and_target_do_not_materialise() -> None:
    src = np.zeros((10, 12, 3), np.uint8)
    sample = window_sample(Sample(src, {"labels": [1]}), -2, -3, 14, 18, MEAN, mask_fill=0)
    assert sample.size == (14, 18) and sample.image_window() is not None
    other = sample.with_target({"labels": [2]})
    assert other.image_window() is sample.image_window()
    assert other.image.shape == (14, 18, 3) and other.image[0, 0].tolist() == list(MEAN)
    other.image = np.ones((3, 4, 3), np.uint8)  # set: the array, no window
    assert other.size == (3, 4) and other.image_window() is not None


def test_edge_pad_and_other_images_are_eager() -> None:
    src = np.random.default_rng(2).integers(0, 256, (8, 9, 3), dtype=np.uint8)
    padded = Pad(2, padding_mode="edge").apply(Sample(src, {}), {})
    assert np.array_equal(padded.image, np.pad(src, ((2, 2), (2, 2), (0, 0)), mode="edge"))
    gray = np.arange(72, dtype=np.float32).reshape(8, 9)
    assert Sample(gray, {}).image_window() is None
    assert ImageWindow.over(src) is not None


@pytest.mark.parametrize("seed", range(120))
def test_resizing_a_window_with_fill_rows_equals_resizing_it_built(seed: int) -> None:
    """``resize_window`` (the fill rows' horizontal pass made once, never built) gives the bytes
    of torch's antialiased resize of the materialised window: shrinks, stretches, kept widths or
    heights, both modes, flips, fills of any colour, windows mostly fill or mostly image."""
    rng = np.random.default_rng(5000 + seed)
    sh, sw = int(rng.integers(1, 60)), int(rng.integers(1, 60))
    src = rng.integers(0, 256, (sh, sw, 3), dtype=np.uint8)
    top, bottom = int(rng.integers(0, 3 * sh + 2)), int(rng.integers(0, 3 * sh + 2))
    left, right = int(rng.integers(0, 2 * sw + 2)), int(rng.integers(0, 2 * sw + 2))
    fill = tuple(int(v) for v in rng.integers(0, 256, 3))
    window = ImageWindow(src, (0, sh, 0, sw), (top, bottom, left, right), fill,
                         bool(rng.integers(2)), bool(rng.integers(2)))
    h, w = window.size
    oh = h if rng.random() < 0.15 else int(rng.integers(1, h + 8))
    ow = w if rng.random() < 0.15 else int(rng.integers(1, w + 8))
    mode = "bicubic" if rng.random() < 0.3 else "bilinear"
    got = resize_window(window, oh, ow, mode)
    if (top + bottom) * 4 < h:
        assert got is None
        return
    assert got is not None and got.shape == (oh, ow, 3)
    want = _torch_resize(window.materialize(), oh, ow, mode)
    assert got.tobytes() == want.tobytes()


def test_a_zoomed_out_ssd_resize_takes_the_window_path_and_equals_the_eager_one() -> None:
    src = np.random.default_rng(3).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    boxes = Boxes(np.array([[10.0, 10.0, 100.0, 90.0]]), "XYXY", (120, 160))
    lazy, eager = Sample(src, {"boxes": boxes}), Sample(src.copy(), {"boxes": boxes})
    zoom = RandomZoomOut(fill={"Image": MEAN, "Mask": 0})
    params = {"padding": [100, 150, 140, 210]}
    lazy, eager = zoom.apply(lazy, params), zoom.apply(eager, params)
    eager.image  # noqa: B018 - built before the resize: the eager path
    tracemalloc.start()
    try:
        out = resize_sample(lazy, [64, 80])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 480 * 400 * 3  # the 480 x 400 canvas was never built
    assert out.image.tobytes() == resize_sample(eager, [64, 80]).image.tobytes()
