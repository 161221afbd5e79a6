"""gpufeed.image: torchvision geometry, determinism, output layouts, validation."""

from __future__ import annotations

import math
import random

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed.decoders import backends, decode
from gpufeed.errors import DecodeError
from gpufeed.image import CropParams, RandomResizedCrop, ResizeCenterCrop, _resample
from gpufeed.synth import encode, photo_like, with_exif_orientation

TURBO = backends()["turbojpeg"]["available"]
requires_turbojpeg = pytest.mark.skipif(
    not TURBO, reason=f"libturbojpeg not loadable: {backends()['turbojpeg']['reason']}")

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


# --- plane path (JPEG decoded to Y/Cb/Cr planes, resized per plane, converted at output size) --

# Plane path vs RGB path for the same crop, 8-bit levels. The plane path resamples chroma once
# (bilinear, straight to the output size) where the RGB path resamples it twice (libjpeg's
# triangle upsampling, then the resize), and converts colour after resizing; both are equally
# far from the unencoded source (test_plane_path_as_close_to_source_as_rgb_path). Measured on
# these images at DCT factor 1: mean per image 0.43-0.97, 99th percentile 2-7 (isolated pixels
# at sharp colour edges up to ~40); on other noisy photo-like sets the 99th percentile reached 9.
# Greyscale: identical. Rounding the chroma crop to whole chroma pixels fails these bounds.
PLANE_MEAN_ABS = 1.2
PLANE_P99_ABS = 10
_SAMPLING = {name: getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{name}")
             for name in ("420", "422", "440", "444")}
LAYOUTS = ["420", "422", "440", "444", "gray", "440-progressive", "gray-progressive"]
TRAIN, EVAL = RandomResizedCrop(224), ResizeCenterCrop(224, 256)


def jpeg(img: np.ndarray, layout: str = "420", quality: int = 90) -> bytes:
    """JPEG bytes of an RGB image with OpenCV: layout "420", "422", "440", "444" or "gray",
    optionally suffixed "-progressive"."""
    sampling, _, progressive = layout.partition("-")
    params = [cv2.IMWRITE_JPEG_QUALITY, quality,
              cv2.IMWRITE_JPEG_PROGRESSIVE, int(bool(progressive))]
    if sampling == "gray":
        src = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    else:
        src = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, _SAMPLING[sampling]]
    ok, buf = cv2.imencode(".jpg", src, params)
    assert ok
    return buf.tobytes()


def both_paths(t, data: bytes, index: int,
               layout: str = "chw") -> tuple[np.ndarray, np.ndarray]:
    """(RGB path, plane path) outputs of ``t`` for sample ``index`` (epoch 1, seed 7)."""
    shape = (3, *t.size) if layout == "chw" else (*t.size, 3)
    rgb, planes = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
    t._apply(data, index, 1, 7, rgb, path="rgb")
    t._apply(data, index, 1, 7, planes, path="planes")
    return rgb, planes


@requires_turbojpeg
@pytest.mark.parametrize("out_layout", ["chw", "hwc"])
@pytest.mark.parametrize("transform", [TRAIN, EVAL], ids=["train", "eval"])
@pytest.mark.parametrize("shape", [(350, 400), (257, 301)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_plane_path_matches_rgb_path(layout, shape, transform, out_layout):
    data = jpeg(photo_like(*shape, seed=3), layout)
    diffs = []
    for index in range(8):  # train: both flips occur among these
        rgb, planes = both_paths(transform, data, index, out_layout)
        diff = np.abs(rgb.astype(np.int16) - planes)
        if layout.startswith("gray"):
            assert not diff.any()
        assert diff.mean() < PLANE_MEAN_ABS
        diffs.append(diff.ravel())
    assert np.percentile(np.concatenate(diffs), 99) <= PLANE_P99_ABS
    if transform is TRAIN:
        assert {TRAIN.params(7, 1, i, *shape).flip for i in range(8)} == {False, True}


@requires_turbojpeg
@pytest.mark.parametrize("layout", ["420", "440"])
def test_plane_path_as_close_to_source_as_rgb_path(layout):
    """The plane path is no approximation of the RGB path: both are as far from the unencoded
    image (measured mean 3.2-3.7 levels each, within 0.07 of each other)."""
    errors = {"rgb": [], "planes": []}
    for seed in range(4):
        img = photo_like(340 + 7 * seed, 390 + 5 * seed, seed=seed)
        data = jpeg(img, layout)
        for index in range(4):
            p = TRAIN.params(7, 1, index, *img.shape[:2])
            ref = reference_crop(img, p, TRAIN.size, "auto").astype(np.int16)
            for name, out in zip(("rgb", "planes"), both_paths(TRAIN, data, index, "hwc")):
                errors[name].append(np.abs(ref - out).mean())
    assert np.mean(errors["planes"]) < np.mean(errors["rgb"]) + 0.15


@requires_turbojpeg
@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_takes_plane_path_only_where_it_pays(layout):
    """apply decodes greyscale and 4:4:0 JPEGs to planes; 4:2:0, 4:2:2 and 4:4:4 were measured
    no faster that way and keep the RGB path, byte for byte."""
    data = jpeg(photo_like(350, 400, seed=3), layout)
    for transform in (TRAIN, EVAL):
        rgb, planes = both_paths(transform, data, 5)
        out = np.empty_like(rgb)
        transform.apply(data, index=5, epoch=1, seed=7, out=out)
        if layout.startswith(("gray", "440")):
            assert np.array_equal(out, planes)
        else:
            assert np.array_equal(out, rgb)
        if not layout.startswith("gray"):
            assert not np.array_equal(rgb, planes)  # so the checks above tell the paths apart


@requires_turbojpeg
@pytest.mark.parametrize("transform", [TRAIN, EVAL], ids=["train", "eval"])
def test_dct_scaled_large_image(transform):
    """A 1200x900 JPEG decoded at 1/2 (or less): greyscale takes the plane path at that scale
    (the Y plane is what the RGB decode replicates: identical); colour keeps the RGB path, since
    at DCT scales below 1 libjpeg-turbo decodes chroma planes at half the scaled size, where the
    RGB decode IDCT-scales chroma to full detail (4:2:0 forced through planes: mean 0.9-1.0,
    99th percentile 11-13 levels from the RGB path, twice the factor-1 figures)."""
    img = photo_like(900, 1200, seed=5)
    gray, color = jpeg(img, "gray"), jpeg(img, "440")
    for index in range(4):
        rgb, planes = both_paths(transform, gray, index)
        assert np.array_equal(rgb, planes)
        out = np.empty_like(rgb)
        transform.apply(color, index=index, epoch=1, seed=7, out=out)
        rgb, planes = both_paths(transform, color, index)
        assert np.array_equal(out, rgb) and not np.array_equal(out, planes)


@requires_turbojpeg
def test_exif_rotated_jpeg_keeps_rgb_path_and_is_correct():
    img = photo_like(300, 500, seed=4, noise=2)
    data = with_exif_orientation(jpeg(img, "440", quality=95), 6)  # displayed 500 x 300
    out, rgb = np.empty((224, 224, 3), np.uint8), np.empty((224, 224, 3), np.uint8)
    EVAL.apply(data, out=out)
    EVAL._apply(data, 0, 0, 0, rgb, path="rgb")
    assert np.array_equal(out, rgb)
    ref = reference_resize_center_crop(np.rot90(img, -1), (224, 224), 256)
    assert np.abs(out.astype(np.int16) - ref).mean() < DCT_MEAN_ABS
    with pytest.raises(ValueError, match="stored orientation"):
        EVAL._apply(data, 0, 0, 0, out, path="planes")


@requires_turbojpeg
def test_cmyk_and_rgb_colorspace_jpegs_keep_rgb_path():
    pil = pytest.importorskip("PIL.Image", reason="pillow is needed to write a CMYK JPEG")
    import io

    img = photo_like(120, 160, seed=6)
    bio = io.BytesIO()
    pil.fromarray(img).convert("CMYK").save(bio, "JPEG", quality=95)
    cmyk = bio.getvalue()
    # A 4:4:0 JPEG whose APP0/JFIF marker is replaced by APP14/Adobe with transform 0: libjpeg
    # reads its three components as R, G, B, not Y, Cb, Cr.
    ycc = jpeg(img, "440")
    assert ycc[2:4] == b"\xff\xe0"
    adobe = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
    rgb_space = ycc[:2] + adobe + ycc[4 + int.from_bytes(ycc[4:6], "big"):]
    t = ResizeCenterCrop(96, 112)
    for data in (cmyk, rgb_space):
        out, rgb = np.empty((96, 96, 3), np.uint8), np.empty((96, 96, 3), np.uint8)
        t.apply(data, out=out)
        t._apply(data, 0, 0, 0, rgb, path="rgb")
        assert np.array_equal(out, rgb)
        assert np.array_equal(out, t.apply_array(decode(data)))
        with pytest.raises(ValueError, match="YCbCr or greyscale"):
            t._apply(data, 0, 0, 0, out, path="planes")
    ref = reference_resize_center_crop(img, (96, 96), 112)
    t.apply(cmyk, out=out)
    assert np.abs(out.astype(np.int16) - ref).mean() < 6


@requires_turbojpeg
@pytest.mark.parametrize("layout", ["440", "gray", "440-progressive"])
def test_truncated_jpeg_raises_decode_error_on_plane_path(layout):
    data = jpeg(photo_like(200, 240, seed=1), layout)
    out = np.empty((3, 96, 96), np.uint8)
    for path in ("auto", "planes"):
        with pytest.raises(DecodeError, match="Premature end of JPEG"):
            RandomResizedCrop(96)._apply(data[: len(data) // 2], 0, 0, 0, out, path=path)


def _plane_path_in_child(args):
    data, indices = args
    out = np.empty((3, 224, 224), np.uint8)
    rows = []
    for index in indices:
        TRAIN.apply(data, index=index, epoch=1, seed=7, out=out)
        rows.append(out.tobytes())
    return rows


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 600), width=st.integers(1, 600), n=st.integers(1, 300),
       extra=st.integers(0, 2))
def test_chroma_span_lines_up_with_luma(start, width, n, extra):
    """cv2.resize of chroma[c0:c1] by inv_step, minus the first `skip` pixels, samples chroma
    where the luma resize of [start, start + width) samples luma, to within half a chroma
    pixel (exactly when start is even), and covers n pixels."""
    stop = start + width
    length = -(-stop // 2) + extra  # the plane reaches at least the region's end
    c0, c1, skip, inv_step = _resample._chroma_span(start, stop, 2, n, length)
    assert 0 <= c0 < c1 <= length and 0 <= skip <= _resample._MAX_SKIP
    assert round((c1 - c0) * inv_step) >= n + skip  # cv2.resize's output length
    plane = np.arange(length, dtype=np.float32)[None, :].repeat(2, 0)  # value = position
    got = cv2.resize(plane[:, c0:c1], None, fx=inv_step, fy=1.0,
                     interpolation=cv2.INTER_LINEAR)[0, skip:skip + n]
    # Luma output pixel j is centred at start + (j + 0.5) * width / n (pixel edges at integers);
    # in chroma pixel-centre coordinates that is half of it, minus 0.5.
    want = (start + (np.arange(n) + 0.5) * width / n) / 2 - 0.5
    inside = (want >= c0) & (want <= c1 - 1)  # away from the region's replicated border
    error = np.abs(got - want)[inside]
    assert error.size == 0 or error.max() <= (0.01 if start % 2 == 0 else 0.51)


def test_chroma_span_mean_offset_is_small():
    """Dropping up to _MAX_SKIP pixels leaves a mean misregistration of a few hundredths of a
    chroma pixel over odd starts (0.5 without it)."""
    rng = np.random.default_rng(0)
    offsets = []
    for _ in range(2000):
        start, width = 2 * int(rng.integers(1, 200)) + 1, int(rng.integers(100, 400))
        c0, _, skip, inv_step = _resample._chroma_span(start, start + width, 2, 224, 400)
        offsets.append(abs(c0 + skip / inv_step - start / 2))
    assert np.mean(offsets) < 0.1
