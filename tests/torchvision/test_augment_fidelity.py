"""gpufeed's augmentations give torchvision's and timm's pixels on PIL images, given the same
parameters (docs/design/augment.md): point ops within 1 grey level (per-image mean absolute
difference), colour ops within 2, resampling warps within 3; nearest-neighbour warps by the
share of differing pixels and hue by the largest difference, each tighter than torchvision's own
tolerance between its PIL and tensor paths. Needs torchvision and timm (.venv-tv)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")
timm_aa = pytest.importorskip("timm.data.auto_augment", reason="timm is not installed (tvtest extra)")

import torch  # noqa: E402
import torchvision.transforms.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.autoaugment import _apply_op  # noqa: E402

from gpufeed.image import augment as A  # noqa: E402
from gpufeed.image.augment import _functional as G  # noqa: E402
from gpufeed.image.augment._policies import apply_op  # noqa: E402
from gpufeed.image.augment._timm_rand import apply_timm_op  # noqa: E402
from tests.torchvision._augment import (  # noqa: E402
    COLOUR,
    GEOMETRY,
    HUE_MAX,
    NEAREST_SHARE,
    POINT,
    max_abs,
    mean_abs,
    rows,
    share_differing,
    share_far,
)

pytestmark = pytest.mark.timeout(120)
ROWS = rows(4)


def _pil(row: np.ndarray) -> Image.Image:
    return Image.fromarray(row)


def _check(ours, theirs, limit: float) -> None:
    for k, row in enumerate(ROWS):
        got = ours(row.copy())
        want = np.asarray(theirs(_pil(row)))
        assert got.shape == row.shape and got.dtype == np.uint8
        assert mean_abs(got, want) <= limit, (k, mean_abs(got, want))


POINT_OPS = {
    "brightness-1.3": (lambda r: G.brightness(r, 1.3), lambda p: F.adjust_brightness(p, 1.3)),
    "brightness-0.4": (lambda r: G.brightness(r, 0.4), lambda p: F.adjust_brightness(p, 0.4)),
    "contrast-0.6": (lambda r: G.contrast(r, 0.6), lambda p: F.adjust_contrast(p, 0.6)),
    "contrast-1.7": (lambda r: G.contrast(r, 1.7), lambda p: F.adjust_contrast(p, 1.7)),
    "solarize-100": (lambda r: G.solarize(r, 100), lambda p: F.solarize(p, 100)),
    "solarize-add-99": (lambda r: G.solarize_add(r, 99, 128),
                        lambda p: timm_aa.solarize_add(p, 99, 128)),
    "posterize-3": (lambda r: G.posterize(r, 3), lambda p: F.posterize(p, 3)),
    "equalize": (G.equalize, F.equalize),
    "autocontrast": (G.autocontrast, F.autocontrast),
    "invert": (G.invert, F.invert),
}


@pytest.mark.parametrize("name", sorted(POINT_OPS))
def test_point_ops(name):
    _check(*POINT_OPS[name], POINT)


COLOUR_OPS = {
    "saturation-1.5": (lambda r: G.color(r, 1.5), lambda p: F.adjust_saturation(p, 1.5)),
    "saturation-0.2": (lambda r: G.color(r, 0.2), lambda p: F.adjust_saturation(p, 0.2)),
    "sharpness-1.9": (lambda r: G.sharpness(r, 1.9), lambda p: F.adjust_sharpness(p, 1.9)),
    "sharpness-0.1": (lambda r: G.sharpness(r, 0.1), lambda p: F.adjust_sharpness(p, 0.1)),
    "grayscale": (G.grayscale, lambda p: F.rgb_to_grayscale(p, 3)),
    "blur-23-1.7": (lambda r: G.blur(r, (23, 23), (1.7, 1.7)),
                    lambda p: F.gaussian_blur(p, [23, 23], [1.7, 1.7])),
    "blur-5x9": (lambda r: G.blur(r, (5, 9), (0.4, 1.2)),
                 lambda p: F.gaussian_blur(p, [5, 9], [0.4, 1.2])),
}


@pytest.mark.parametrize("name", sorted(COLOUR_OPS))
def test_colour_ops(name):
    _check(*COLOUR_OPS[name], COLOUR)


@pytest.mark.parametrize("factor", [-0.5, -0.2, 0.05, 0.3, 0.45])
def test_hue(factor):
    for row in ROWS:
        got = G.hue(row.copy(), factor)
        want = np.asarray(F.adjust_hue(_pil(row), factor))
        assert mean_abs(got, want) <= COLOUR
        assert max_abs(got, want) <= HUE_MAX


def test_color_jitter_given_its_params():
    op = A.ColorJitter(0.4, 0.4, 0.4, 0.1)
    fns = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    for k, row in enumerate(ROWS * 3):
        params = op.draw(A.row_rng(0, 0, k), *row.shape[:2])
        assert sorted(i for i, _ in params) == [0, 1, 2, 3]
        want = _pil(row)
        for i, factor in params:
            want = fns[i](want, factor)
        got = op.apply(row.copy(), params)
        assert mean_abs(got, np.asarray(want)) <= COLOUR, params
        assert max_abs(got, np.asarray(want)) <= HUE_MAX, params


def test_random_ops_given_their_params():
    cases = [
        (A.RandomGrayscale(1.0), lambda p: F.rgb_to_grayscale(p, 3)),
        (A.RandomSolarize(77, 1.0), lambda p: F.solarize(p, 77)),
        (A.RandomPosterize(5, 1.0), lambda p: F.posterize(p, 5)),
        (A.RandomEqualize(1.0), F.equalize),
        (A.RandomAutocontrast(1.0), F.autocontrast),
        (A.RandomInvert(1.0), F.invert),
        (A.RandomAdjustSharpness(1.6, 1.0), lambda p: F.adjust_sharpness(p, 1.6)),
        (A.RandomHorizontalFlip(1.0), F.hflip),
        (A.RandomVerticalFlip(1.0), F.vflip),
    ]
    for op, theirs in cases:
        _check(lambda r, op=op: op(r, A.row_rng(0, 0, 0)), theirs, POINT)
    blur = A.GaussianBlur(9, (0.1, 2.0))
    for k, row in enumerate(ROWS):
        sigma = blur.draw(A.row_rng(1, 0, k), *row.shape[:2])
        want = np.asarray(F.gaussian_blur(_pil(row), [9, 9], [sigma, sigma]))
        assert mean_abs(blur.apply(row.copy(), sigma), want) <= COLOUR


@pytest.mark.parametrize("fill", [None, (10, 200, 30)])
def test_rotation_nearest(fill):
    op = A.RandomRotation(45, fill=0 if fill is None else fill)
    for k, row in enumerate(ROWS * 2):
        angle = op.draw(A.row_rng(2, 0, k), *row.shape[:2])
        want = np.asarray(F.rotate(_pil(row), angle, fill=None if fill is None else list(fill)))
        assert share_differing(op.apply(row.copy(), angle), want) <= NEAREST_SHARE, angle


AFFINES = [A.RandomAffine(30, (0.2, 0.1), (0.7, 1.3), 15),
           A.RandomAffine(0, shear=(-20, 20, -10, 10), fill=(10, 200, 30)),
           A.RandomAffine(180, (0.3, 0.3), (0.5, 1.5), fill=(124, 116, 104))]


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("k", range(len(AFFINES)))
def test_affine(k, interpolation):
    op = dataclasses.replace(AFFINES[k], interpolation=interpolation)
    mode = InterpolationMode(interpolation)
    for j, row in enumerate(ROWS * 2):
        params = op.draw(A.row_rng(4, 0, j), *row.shape[:2])
        angle, shift, scale, shear = params
        want = np.asarray(F.affine(_pil(row), angle, list(shift), scale, list(shear),
                                   interpolation=mode, fill=list(op.fill)))
        got = op.apply(row.copy(), params)
        if interpolation == "nearest":
            assert share_differing(got, want) <= NEAREST_SHARE, params
        else:
            assert mean_abs(got, want) <= GEOMETRY, params


WARPS = [("ShearX", 0.3), ("ShearX", -0.99), ("ShearY", 0.5), ("TranslateX", -20.0),
         ("TranslateY", 31.0), ("TranslateX", 101.4), ("Rotate", 23.0), ("Rotate", -90.0),
         ("Rotate", 135.0), ("Rotate", 0.0)]


@pytest.mark.parametrize("op,magnitude", WARPS)
@pytest.mark.parametrize("fill", [None, [124, 116, 104]])
def test_policy_warps_nearest(op, magnitude, fill):
    ours_fill = (0, 0, 0) if fill is None else tuple(fill)
    for row in ROWS:
        got = apply_op(row.copy(), op, magnitude, "nearest", ours_fill)
        want = np.asarray(_apply_op(_pil(row), op, magnitude,
                                    interpolation=InterpolationMode.NEAREST, fill=fill))
        assert share_differing(got, want) <= NEAREST_SHARE


POLICY_PIXEL_OPS = [("Brightness", -0.9), ("Brightness", 0.99), ("Color", 0.5), ("Color", -0.7),
                    ("Contrast", 0.3), ("Contrast", -0.99), ("Sharpness", 0.9),
                    ("Sharpness", -0.5), ("Posterize", 4.0), ("Posterize", 2.0),
                    ("Solarize", 127.5), ("Solarize", 0.0), ("AutoContrast", 0.0),
                    ("Equalize", 0.0), ("Invert", 0.0), ("Identity", 0.0)]


@pytest.mark.parametrize("op,magnitude", POLICY_PIXEL_OPS)
def test_policy_pixel_ops(op, magnitude):
    limit = COLOUR if op in ("Color", "Sharpness") else POINT
    _check(lambda r: apply_op(r, op, magnitude),
           lambda p: _apply_op(p, op, magnitude, interpolation=InterpolationMode.NEAREST,
                               fill=None), limit)


@pytest.mark.parametrize("policy", [A.TrivialAugmentWide(), A.RandAugment(2, 9),
                                    A.AutoAugment(), A.RandAugment(3, 20, fill=128)],
                         ids=["trivial", "rand-2-9", "auto", "rand-3-20-fill"])
def test_policies_given_their_params(policy):
    """Compositions of a policy's ops, each from its own bin and sign."""
    fill = None if policy.fill == (0, 0, 0) else list(policy.fill)
    for k in range(24):
        row = ROWS[k % len(ROWS)]
        params = policy.draw(A.row_rng(5, 1, k), *row.shape[:2])
        want = _pil(row)
        for op, magnitude in params:
            want = _apply_op(want, op, magnitude, interpolation=InterpolationMode.NEAREST,
                             fill=fill)
        got = policy.apply(row.copy(), params)
        want_a = np.asarray(want)
        # a warp's few differing pixels move the histogram of a later equalize/autocontrast
        # by a level: compositions are judged by the pixels more than 2 levels apart
        assert share_far(got, want_a, 2) <= NEAREST_SHARE, params
        assert mean_abs(got, want_a) <= COLOUR, params


_PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
TIMM_WARPS = [("ShearX", (0.27,)), ("ShearY", (-0.27,)), ("TranslateXRel", (0.4,)),
              ("TranslateYRel", (-0.3,)), ("Rotate", (27.0,)), ("Rotate", (-9.0,))]


@pytest.mark.parametrize("name,args", TIMM_WARPS)
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_timm_warps(name, args, interpolation):
    fill = (124, 116, 104)  # timm's img_mean for ImageNet's mean
    for row in ROWS:
        got = apply_timm_op(row.copy(), name, args, interpolation, fill)
        want = np.asarray(timm_aa.NAME_TO_OP[name](
            _pil(row), *args, fillcolor=fill, resample=_PIL_FILTERS[interpolation]))
        if interpolation == "nearest":
            assert share_differing(got, want) <= NEAREST_SHARE
        else:
            assert mean_abs(got, want) <= GEOMETRY


def _assert_timm_ops_match(op, seed: int) -> None:
    """``op`` (a timm policy) applies the ops it draws as timm's own op functions do, on PIL."""
    for k in range(24):
        row = ROWS[k % len(ROWS)]
        params = op.draw(A.row_rng(seed, 0, k), *row.shape[:2])
        want = _pil(row)
        for name, args, interp in params:
            kwargs = {"fillcolor": op.fill}
            if interp in _PIL_FILTERS:
                kwargs["resample"] = _PIL_FILTERS[interp]
            # GaussianBlurRand draws its radius inside timm's op; gpufeed's args are that radius
            timm_op = timm_aa.gaussian_blur if name == "GaussianBlurRand" else timm_aa.NAME_TO_OP[name]
            want = timm_op(want, *args, **kwargs)
        got = op.apply(row.copy(), params)
        assert mean_abs(got, np.asarray(want)) <= GEOMETRY, params


@pytest.mark.parametrize("config", ["rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5", "rand-m7-n3-p1",
                                    "rand-m9-mstd0.5-t3a", "rand-m9-mstd0.5-inc1-t3aw"])
def test_timm_rand_augment_given_its_params(config):
    _assert_timm_ops_match(A.TimmRandAugment.from_config(config), seed=6)


def test_random_erasing_given_its_params():
    img = torch.randn(3, 112, 100)
    for op in (A.RandomErasing(1.0), A.RandomErasing(1.0, value="random"),
               A.RandomErasing(1.0, value=(0.1, -0.2, 0.3)),
               A.TimmRandomErasing(1.0, mode="pixel", max_count=3),
               A.TimmRandomErasing(1.0, mode="rand")):
        for k in range(8):
            params = op.draw(A.row_rng(7, 0, k), 112, 100)
            want = img.clone()
            for top, left, h, w, value in params:
                want = F.erase(want, top, left, h, w, torch.as_tensor(value))
            got = op.apply(img.clone(), params)
            assert torch.equal(got, want)
            np_got = op.apply(img.numpy().copy(), params)
            assert np.array_equal(np_got, want.numpy())


def test_timm_from_timm_object_matches_config():
    ra = timm_aa.rand_augment_transform("rand-m9-mstd0.5-inc1",
                                        {"translate_const": 100, "img_mean": (124, 116, 104)})
    ours = A.TimmRandAugment.from_timm(ra)
    assert ours.ops == tuple(o.name for o in ra.ops)
    assert (ours.magnitude, ours.magnitude_std, ours.prob, ours.num_layers) == (9.0, 0.5, 0.5, 2)
    assert ours.fill == (124, 116, 104) and ours.interpolation == "random"
    assert not math.isinf(ours.magnitude_std)


V2_OPS = [("ShearX", 0.5), ("ShearY", -0.3), ("TranslateX", 20.0), ("TranslateY", -11.0),
          ("Rotate", 30.0), ("Brightness", 0.5), ("Color", -0.5), ("Contrast", 0.5),
          ("Sharpness", 0.7), ("Posterize", 4.0), ("AutoContrast", 0.0), ("Equalize", 0.0)]


@pytest.mark.parametrize("op,magnitude", V2_OPS)
def test_policy_ops_match_v2_on_uint8_tensors(op, magnitude):
    """torchvision's v2 recipe runs TrivialAugmentWide on uint8 tensors (after ToImage): its
    kernels agree with PIL's here but for saturation (a float grey, 0.26 levels)."""
    import torchvision.transforms.v2 as V

    v2 = V.TrivialAugmentWide()
    for row in ROWS:
        tensor = torch.from_numpy(row).permute(2, 0, 1).contiguous()
        want = v2._apply_image_or_video_transform(
            tensor, op, magnitude, interpolation=InterpolationMode.NEAREST, fill=v2._fill)
        got = apply_op(row.copy(), op, magnitude)
        want_a = want.permute(1, 2, 0).numpy()
        if op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
            assert share_differing(got, want_a) <= NEAREST_SHARE
        else:
            assert mean_abs(got, want_a) <= (COLOUR if op == "Color" else POINT)


@pytest.mark.parametrize("config", ["original-mstd0.5", "v0r-mstd0.5", "3a", "3a-mstd1"])
def test_timm_auto_augment_given_its_params(config):
    _assert_timm_ops_match(A.TimmAutoAugment.from_config(config), seed=8)


@pytest.mark.parametrize("config", ["original-mstd0.5", "originalr", "v0", "v0r-mstd1", "3a"])
def test_timm_auto_from_timm_object_matches_config(config):
    hparams = {"translate_const": 100, "img_mean": (124, 116, 104)}
    aa = timm_aa.auto_augment_transform(config, hparams)
    ours = A.TimmAutoAugment.from_timm(aa)
    assert ours == A.TimmAutoAugment.from_config(config, fill=(124, 116, 104), translate_const=100)
    assert ours.policy == tuple(tuple((o.name, o.prob, o.magnitude) for o in sub) for sub in aa.policy)


@pytest.mark.parametrize("radius", [0.1, 0.45, 1.0, 1.37, 2.0])
def test_timm_gaussian_blur_is_pils_exactly(radius):
    """timm's GaussianBlur and GaussianBlurRand call PIL's box-pass blur; gpufeed computes its
    integer passes exactly (functional.pil_gaussian_blur), so every level agrees."""
    for row in ROWS + rows(2, seed=9):
        want = np.asarray(timm_aa.gaussian_blur(_pil(row), radius))
        for name in ("GaussianBlur", "GaussianBlurRand"):
            got = apply_timm_op(row.copy(), name, (radius,), "random", (128, 128, 128))
            assert np.array_equal(got, want), (name, radius, share_differing(got, want))


@pytest.mark.parametrize("level", [0.5, 0.72, 0.9, 1.0])
def test_timm_desaturate(level):
    """Desaturate is ``ImageEnhance.Color`` towards PIL's grey: the grey is OpenCV's BT.601 in
    14-bit fixed point where PIL's is 16-bit (functional.grey), one level off in 0.15% of a
    photo's pixels, so the share of differing pixels is held to 0.5% and no level is off by more
    than one."""
    for row in ROWS:
        got = apply_timm_op(row.copy(), "Desaturate", (level,), "random", (128, 128, 128))
        want = np.asarray(timm_aa.desaturate(_pil(row), level))
        assert share_differing(got, want) <= 0.005, share_differing(got, want)
        assert max_abs(got, want) <= 1
