"""gpufeed.transforms: torchvision geometry, determinism, output layouts, validation."""

from __future__ import annotations

import math
import multiprocessing as mp
import random

import cv2
import numpy as np
import pytest

from gpufeed.decode import decode
from gpufeed.synth import encode, photo_like, with_exif_orientation
from gpufeed.transforms import CropParams, RandomResizedCrop, ResizeCenterCrop

# Tolerances (mean absolute difference, 8-bit levels) against the full-resolution reference
# (INTER_AREA resize of the whole image, then crop). At full resolution the crop box is rounded to
# whole pixels, and interpolation="auto" resamples shrinks below 2x bilinearly, keeping more of
# the images' noise (sigma 6) than the box filter: measured 0.4-2.2 ("area": 0.4-1.7).
# A DCT-scaled decode also filters differently from INTER_AREA: measured 1.2-2.8.
FULL_RES_MEAN_ABS = 2.5
DCT_MEAN_ABS = 4.0


def reference_resize_center_crop(img: np.ndarray, size: tuple[int, int], resize: int) -> np.ndarray:
    """torchvision Resize(resize) + CenterCrop(size), written with cv2 at full resolution."""
    h, w = img.shape[:2]
    if w <= h:
        nh, nw = int(resize * h / w), resize
    else:
        nh, nw = resize, int(resize * w / h)
    shrink = nh <= h and nw <= w  # torchvision: antialiased bilinear; cv2: area down, linear up
    mode = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    resized = cv2.resize(img, (nw, nh), interpolation=mode)
    th, tw = size
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    return resized[top:top + th, left:left + tw]


def reference_crop(img: np.ndarray, p: CropParams, size: tuple[int, int],
                   mode: str = "area") -> np.ndarray:
    """Crop, then resize (INTER_AREA on shrink, or as ``interpolation="auto"`` picks), flip."""
    region = img[p.top:p.top + p.height, p.left:p.left + p.width]
    shrink = p.height >= size[0] and p.width >= size[1]
    if mode == "auto":
        shrink = shrink and (p.height >= 2 * size[0] or p.width >= 2 * size[1])
    out = cv2.resize(region, (size[1], size[0]),
                     interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return out[:, ::-1] if p.flip else out


SHAPES = [(350, 400), (500, 375), (1200, 900), (240, 320), (256, 256), (300, 1000), (257, 255)]


# --- ResizeCenterCrop -----------------------------------------------------------------------

def test_resized_size_is_torchvision_rule():
    t = ResizeCenterCrop(224, 256)
    assert t.resized_size(350, 400) == (256, int(256 * 400 / 350))
    assert t.resized_size(500, 375) == (int(256 * 500 / 375), 256)
    assert t.resized_size(256, 256) == (256, 256)
    assert t.output_size == (224, 224) and t.deterministic


@pytest.mark.parametrize("shape", SHAPES)
def test_resize_center_crop_matches_reference_full_res(shape):
    img = photo_like(*shape, seed=shape[0])
    t = ResizeCenterCrop(224, 256)
    out = t.apply_array(img)
    ref = reference_resize_center_crop(img, (224, 224), 256)
    assert out.shape == (224, 224, 3)
    assert np.abs(out.astype(np.int16) - ref).mean() < FULL_RES_MEAN_ABS


@pytest.mark.parametrize("shape", SHAPES)
def test_resize_center_crop_bytes_with_dct_scaling(shape):
    data = encode(photo_like(*shape, seed=shape[1]), quality=95)
    full = decode(data)
    ref = reference_resize_center_crop(full, (224, 224), 256)
    out = np.empty((224, 224, 3), np.uint8)
    ResizeCenterCrop(224, 256).apply(data, out=out)
    assert np.abs(out.astype(np.int16) - ref).mean() < DCT_MEAN_ABS
    exact = np.empty_like(out)
    ResizeCenterCrop(224, 256, dct_scaling=False).apply(data, out=exact)
    assert np.array_equal(exact, ResizeCenterCrop(224, 256).apply_array(full))


def test_resize_center_crop_rectangular_size():
    img = photo_like(300, 500, seed=9)
    t = ResizeCenterCrop((160, 200), 224)
    out = t.apply_array(img)
    assert out.shape == (160, 200, 3)
    ref = reference_resize_center_crop(img, (160, 200), 224)
    assert np.abs(out.astype(np.int16) - ref).mean() < FULL_RES_MEAN_ABS


@pytest.mark.parametrize("mode", ["auto", "area", "linear"])
@pytest.mark.parametrize("shape", [(350, 400), (1200, 900)])
def test_interpolation_modes_close_to_reference(mode, shape):
    img = photo_like(*shape, seed=1, noise=2)
    out = ResizeCenterCrop(224, 256, interpolation=mode).apply_array(img)
    ref = reference_resize_center_crop(img, (224, 224), 256)
    limit = 3.0 if (mode, shape) == ("linear", (1200, 900)) else FULL_RES_MEAN_ABS  # aliasing
    assert np.abs(out.astype(np.int16) - ref).mean() < limit


def test_upscale_small_image():
    img = photo_like(60, 80, seed=2)
    out = ResizeCenterCrop(224, 256).apply_array(img)
    ref = reference_resize_center_crop(img, (224, 224), 256)
    assert np.abs(out.astype(np.int16) - ref).mean() < 3.0


def test_exif_rotated_source_is_cropped_in_displayed_axes():
    img = photo_like(300, 500, seed=4, noise=2)
    data = with_exif_orientation(encode(img, quality=95), 6)  # displayed 500 x 300
    out = np.empty((224, 224, 3), np.uint8)
    ResizeCenterCrop(224, 256).apply(data, out=out)
    ref = reference_resize_center_crop(np.rot90(img, -1), (224, 224), 256)
    assert np.abs(out.astype(np.int16) - ref).mean() < DCT_MEAN_ABS


def test_backends_agree_through_transform():
    data = encode(photo_like(350, 400, seed=3))
    a, b = np.empty((64, 64, 3), np.uint8), np.empty((64, 64, 3), np.uint8)
    RandomResizedCrop(64, backend="opencv").apply(data, index=3, epoch=1, seed=2, out=a)
    RandomResizedCrop(64).apply(data, index=3, epoch=1, seed=2, out=b)
    assert np.abs(a.astype(np.int16) - b).max() <= 4  # the decoders' parity bound


# --- output layouts -------------------------------------------------------------------------

@pytest.mark.parametrize("transform", [ResizeCenterCrop(224, 256), RandomResizedCrop(224)])
def test_chw_and_hwc_outputs_agree(transform):
    data = encode(photo_like(350, 400, seed=3))
    hwc = np.empty((224, 224, 3), np.uint8)
    batch = np.zeros((4, 3, 224, 224), np.uint8)  # planar batch rows, as the engine uses them
    for index in range(4):
        transform.apply(data, index=index, epoch=1, seed=7, out=hwc)
        transform.apply(data, index=index, epoch=1, seed=7, out=batch[index])
        assert np.array_equal(batch[index], hwc.transpose(2, 0, 1))


def test_writes_into_batch_row_in_place():
    batch = np.zeros((2, 64, 48, 3), np.uint8)
    data = encode(photo_like(100, 120, seed=3))
    RandomResizedCrop((64, 48)).apply(data, index=1, epoch=0, seed=0, out=batch[1])
    assert batch[1].any() and not batch[0].any()


@pytest.mark.parametrize("bad, match", [
    (np.empty((224, 224, 3), np.float32), "C-contiguous uint8"),
    (np.empty((224, 448, 3), np.uint8)[:, ::2], "C-contiguous uint8"),
    (np.empty((224, 224), np.uint8), "must have shape"),
    (np.empty((225, 224, 3), np.uint8), "must have shape"),
])
def test_bad_out_rejected(bad, match):
    data = encode(photo_like(50, 50, seed=0))
    with pytest.raises(ValueError, match=match):
        ResizeCenterCrop(224, 256).apply(data, out=bad)


# --- RandomResizedCrop ----------------------------------------------------------------------

def test_params_deterministic_per_seed_epoch_index():
    t = RandomResizedCrop(224)
    a = [t.params(3, 1, i, 375, 500) for i in range(200)]
    assert a == [t.params(3, 1, i, 375, 500) for i in range(200)]
    other_epoch = [t.params(3, 2, i, 375, 500) for i in range(200)]
    other_seed = [t.params(4, 1, i, 375, 500) for i in range(200)]
    assert sum(x != y for x, y in zip(a, other_epoch)) > 190
    assert sum(x != y for x, y in zip(a, other_seed)) > 190
    assert len(set(a)) > 190  # indices differ too


def _params_in_child(args):
    seed, epoch, indices = args
    t = RandomResizedCrop(224)
    return [t.params(seed, epoch, i, 375, 500) for i in indices]


def test_params_identical_in_another_process():
    t = RandomResizedCrop(224)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        child = pool.map(_params_in_child, [(11, 5, list(range(50)))])[0]
    assert child == [t.params(11, 5, i, 375, 500) for i in range(50)]


@pytest.mark.parametrize("shape", [(375, 500), (500, 375), (224, 224), (1000, 90)])
def test_params_within_bounds(shape):
    height, width = shape
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    t = RandomResizedCrop(224, scale=scale, ratio=ratio)
    params = [t.params(0, 0, i, height, width) for i in range(3000)]
    fallback = 0
    for p in params:
        assert 0 <= p.top and p.top + p.height <= height
        assert 0 <= p.left and p.left + p.width <= width
        area = p.height * p.width / (height * width)
        aspect = p.width / p.height
        # rounding h and w to ints moves area and aspect a little: allow one pixel each way
        slack_a = (p.height + p.width + 1) / (height * width)
        slack_r = aspect * (1 / p.height + 1 / p.width) * 1.01
        in_bounds = (scale[0] - slack_a <= area <= scale[1] + slack_a
                     and ratio[0] - slack_r <= aspect <= ratio[1] + slack_r)
        fallback += not in_bounds
        if not in_bounds:  # only the center-crop fallback may leave the bounds
            assert p.top == (height - p.height) // 2 and p.left == (width - p.width) // 2
    if shape != (1000, 90):
        assert fallback == 0
    flips = np.mean([p.flip for p in params])
    assert 0.45 < flips < 0.55
    # Same distribution as torchvision's get_params driven by Python's RNG (means within noise).
    ref = [_torchvision_get_params(random.Random(i), height, width, scale, ratio)
           for i in range(3000)]
    for stat in (lambda hw: hw[0] * hw[1], lambda hw: hw[1] / hw[0], lambda hw: hw[0]):
        ours = np.array([stat((p.height, p.width)) for p in params], dtype=float)
        theirs = np.array([stat((h, w)) for _, _, h, w in ref], dtype=float)
        assert abs(ours.mean() - theirs.mean()) < 4 * np.hypot(ours.std(), theirs.std()) / 50 + 1e-9


def _torchvision_get_params(rng, height, width, scale, ratio):
    """torchvision.transforms.RandomResizedCrop.get_params, with random.Random for torch's RNG."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def test_fallback_is_torchvision_center_crop():
    t = RandomResizedCrop(32, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    # the whole-image square crop never fits a non-square image: all 10 tries fail
    p = t.params(0, 0, 0, 100, 300)
    assert (p.top, p.left, p.height, p.width) == (0, 100, 100, 100)
    p = t.params(0, 0, 0, 300, 100)
    assert (p.top, p.left, p.height, p.width) == (100, 0, 100, 100)
    p = t.params(0, 0, 0, 80, 80)  # fits at the first try
    assert (p.top, p.left, p.height, p.width) == (0, 0, 80, 80)
    narrow = RandomResizedCrop(32, scale=(0.5, 1.0), ratio=(3 / 4, 4 / 3))
    p = narrow.params(0, 0, 0, 10, 1000)  # far wider than 4/3: the fallback limits the ratio
    assert (p.height, p.width) == (10, 13) and p.left == (1000 - 13) // 2


def test_flip_false_never_flips():
    t = RandomResizedCrop(224, flip=False)
    assert not any(t.params(0, 0, i, 300, 300).flip for i in range(500))


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("mode", ["auto", "area"])
def test_random_resized_crop_matches_reference(index, mode):
    img = photo_like(375, 500, seed=index)
    t = RandomResizedCrop(96, interpolation=mode)
    p = t.params(5, 2, index, 375, 500)
    out = t.apply_array(img, index=index, epoch=2, seed=5)
    assert np.array_equal(out, reference_crop(img, p, (96, 96), mode))
    # and the fast "auto" stays close to the antialiased (area) reference
    assert np.abs(out.astype(np.int16) - reference_crop(img, p, (96, 96))).mean() < 3.0


@pytest.mark.parametrize("index", range(6))
def test_random_resized_crop_bytes_close_to_reference(index):
    data = encode(photo_like(375, 500, seed=index), quality=95)
    full = decode(data)
    t = RandomResizedCrop(64)
    p = t.params(5, 2, index, 375, 500)
    out = np.empty((64, 64, 3), np.uint8)
    t.apply(data, index=index, epoch=2, seed=5, out=out)
    ref = reference_crop(full, p, (64, 64))
    assert np.abs(out.astype(np.int16) - ref).mean() < DCT_MEAN_ABS
    nodct = np.empty_like(out)
    RandomResizedCrop(64, dct_scaling=False).apply(data, index=index, epoch=2, seed=5, out=nodct)
    assert np.array_equal(nodct, reference_crop(full, p, (64, 64), "auto"))


# --- validation -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(size=-1), "`size` must be > 0. Found: -1."),
    (dict(size=(224, 0)), "`size` must be > 0. Found: (224, 0)."),
    (dict(size=2.5), "`size` must be an int or a (height, width) pair of ints. Found: 2.5."),
    (dict(scale=(0.5, 0.1)), "`scale` must satisfy 0 < min <= max. Found: (0.5, 0.1)."),
    (dict(ratio=(0, 1)), "`ratio` must satisfy 0 < min <= max. Found: (0, 1)."),
    (dict(ratio=3), "`ratio` must be a pair (min, max). Found: 3."),
    (dict(interpolation="cubic"), "`interpolation` must be one of"),
    (dict(backend="pil"), "`backend` must be None or one of"),
])
def test_random_resized_crop_validation(kwargs, message):
    with pytest.raises(ValueError) as info:
        RandomResizedCrop(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(size=0), "`size` must be > 0. Found: 0."),
    (dict(resize=-3), "`resize` must be an int > 0. Found: -3."),
    (dict(size=300, resize=256), "`resize` must be >= the crop size"),
])
def test_resize_center_crop_validation(kwargs, message):
    with pytest.raises(ValueError) as info:
        ResizeCenterCrop(**kwargs)
    assert message in str(info.value)


def test_transforms_are_frozen_and_hashable():
    t = RandomResizedCrop([128, 96], seed=3)
    assert t.size == (128, 96) and t.output_size == (128, 96) and not t.deterministic
    with pytest.raises(AttributeError):
        t.size = (1, 1)  # type: ignore[misc]
    assert hash(t) == hash(RandomResizedCrop((128, 96), seed=3))
    assert math.isclose(t.ratio[1], 4 / 3)
