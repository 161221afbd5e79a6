"""The affine and photometric joint ops without torchvision: identity parameters change nothing,
a quarter turn with ``expand`` moves boxes, keypoints, masks and the image as a rotation by 90
degrees does, clamping follows the leaf's mode, lazy masks equal dense ones, draws repeat for a
seed, arguments are checked, and the image-only ops leave the target alone. Fidelity to
torchvision: tests/torchvision/test_detection_affine_fidelity.py."""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.image.augment import ColorJitter, RandomGrayscale
from gpufeed.image.detection._affine import RandomAffine, RandomRotation
from gpufeed.image.detection._photometric import ImageOnly, RandomPhotometricDistort
from gpufeed.image.detection._sample import BOX_FORMATS, Boxes, KeyPoints, Mask, Sample, sample_rng
from tests.unit._planes import ArrayPlanes

H, W = 30, 44
IDENTITY = {"angle": 0.0, "translate": (0, 0), "scale": 1.0, "shear": (0.0, 0.0)}




def xyxy_to(fmt: str, xyxy: np.ndarray) -> np.ndarray:
    out = xyxy.astype(np.float64).copy()
    if fmt == "XYWH":
        out[:, 2:] -= out[:, :2]
    elif fmt == "CXCYWH":
        out[:, :2] = (xyxy[:, :2] + xyxy[:, 2:]) / 2
        out[:, 2:] = xyxy[:, 2:] - xyxy[:, :2]
    return out


def make_sample(fmt: str = "XYXY", lazy: bool = False, clamping: str | None = "soft") -> Sample:
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    planes = (rng.random((2, H, W)) < 0.4).astype(np.uint8)
    xyxy = np.array([[2.0, 3.0, 20.0, 15.0], [10.5, 0.0, 43.0, 29.5]])
    mask = Mask(lazy=ArrayPlanes(planes)) if lazy else Mask(planes)
    target = {"boxes": Boxes(xyxy_to(fmt, xyxy), fmt, (H, W), clamping), "masks": mask,
              "keypoints": KeyPoints(np.array([[[1.0, 2.0], [40.0, 25.0]]]), (H, W)), "labels": [1, 2]}
    return Sample(image, target)


@pytest.mark.parametrize("fmt", BOX_FORMATS)
@pytest.mark.parametrize("op, params", [
    (RandomAffine(0), IDENTITY),
    (RandomAffine(10, interpolation="bilinear"), IDENTITY),
    (RandomRotation(0), {"angle": 0.0}),
    (RandomRotation(0, center=(W / 2, H / 2)), {"angle": 0.0}),
    (RandomRotation(0, expand=True), {"angle": 360.0}),
])
def test_identity_parameters_change_nothing(fmt: str, op, params) -> None:
    sample = make_sample(fmt)
    before = make_sample(fmt)
    out = op.apply(sample, params)
    np.testing.assert_array_equal(out.image, before.image)
    np.testing.assert_allclose(out.target["boxes"].data, before.target["boxes"].data, atol=1e-9)
    assert out.target["boxes"].canvas == (H, W)
    np.testing.assert_allclose(out.target["keypoints"].data, before.target["keypoints"].data, atol=1e-9)
    np.testing.assert_array_equal(out.target["masks"].dense(), before.target["masks"].dense())
    assert out.target["labels"] == [1, 2]


@pytest.mark.parametrize("fmt", BOX_FORMATS)
def test_quarter_turn_with_expand(fmt: str) -> None:
    """Counter-clockwise by 90 degrees: (x, y) goes to (y, W - x), the canvas to (W, H)."""
    sample = make_sample(fmt)
    before = make_sample(fmt)
    out = RandomRotation((90, 90), expand=True).apply(sample, {"angle": 90.0})
    assert out.image.shape == (W, H, 3)
    np.testing.assert_array_equal(out.image, np.rot90(before.image, 1, axes=(0, 1)))
    np.testing.assert_array_equal(out.target["masks"].dense(), np.rot90(before.target["masks"].dense(), 1, axes=(1, 2)))
    x0, y0, x1, y1 = np.array([[2.0, 3.0, 20.0, 15.0], [10.5, 0.0, 43.0, 29.5]]).T
    expected = np.stack([y0, W - x1, y1, W - x0], axis=1)
    boxes = out.target["boxes"]
    assert boxes.canvas == (W, H) and boxes.format == fmt
    np.testing.assert_allclose(boxes.data, xyxy_to(fmt, expected), atol=1e-9)
    kp = out.target["keypoints"]
    np.testing.assert_allclose(kp.data, [[[2.0, W - 1.0], [25.0, W - 40.0]]], atol=1e-9)
    assert kp.canvas == (W, H)


def test_general_rotation_matches_quarter_turn_geometry() -> None:
    """A rotation about an explicit centre takes the warp path; by 90 degrees on a square image
    about its centre it is the quarter turn, pixel for pixel."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
    planes = rng.integers(0, 5, (1, 20, 20), dtype=np.uint8)
    sample = Sample(image.copy(), {"masks": Mask(planes.copy())})
    out = RandomRotation(0, center=(10.0, 10.0)).apply(sample, {"angle": 90.0})
    np.testing.assert_array_equal(out.image, np.rot90(image, 1, axes=(0, 1)))
    np.testing.assert_array_equal(out.target["masks"].dense(), np.rot90(planes, 1, axes=(1, 2)))


@pytest.mark.parametrize("clamping", ["soft", "hard", None])
def test_translation_clamps_per_mode(clamping: str | None) -> None:
    sample = make_sample("XYXY", clamping=clamping)
    out = RandomAffine(0).apply(sample, {**IDENTITY, "translate": (10, -5)})
    raw = np.array([[12.0, -2.0, 30.0, 10.0], [20.5, -5.0, 53.0, 24.5]])
    expected = raw if clamping is None else np.stack(
        [raw[:, 0].clip(0, W), raw[:, 1].clip(0, H), raw[:, 2].clip(0, W), raw[:, 3].clip(0, H)], 1)
    np.testing.assert_allclose(out.target["boxes"].data, expected, atol=1e-9)
    np.testing.assert_allclose(out.target["keypoints"].data, [[[11.0, -3.0], [50.0, 20.0]]], atol=1e-9)
    # the image moved by (10, -5), filled with 0 where nothing came from
    src = make_sample().image
    np.testing.assert_array_equal(out.image[:H - 5, 10:], src[5:, :W - 10])
    assert not out.image[:, :10].any() and not out.image[H - 5:].any()


@pytest.mark.parametrize("op, params", [
    (RandomAffine(20, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=(-5, 5, -3, 3)), None),
    (RandomRotation(30, expand=True), None),
    (RandomRotation(30, center=(5.0, 7.0), fill={"Mask": 255, "others": 9}), None),
])
def test_lazy_and_dense_masks_agree(op, params) -> None:
    dense, lazy = make_sample(), make_sample(lazy=True)
    for s in (dense, lazy):  # a crop map pending before the warp
        s.target["masks"].select(np.arange(2, H), np.arange(-1, W - 1))
    params = op.draw(sample_rng(1, 0, 5), dense)
    a = op.apply(dense, params).target["masks"].dense()
    b = op.apply(lazy, params).target["masks"].dense()
    np.testing.assert_array_equal(a, b)
    assert a.shape[0] == 2


def test_single_plane_mask_keeps_its_shape() -> None:
    plane = np.arange(H * W, dtype=np.int64).reshape(H, W) % 7
    sample = Sample(np.zeros((H, W, 3), np.uint8), [Mask(plane)])
    out = RandomAffine(15, scale=(0.9, 1.1)).apply(sample, {**IDENTITY, "angle": 12.0, "scale": 1.05})
    dense = out.target[0].dense()
    assert dense.shape == (H, W) and dense.dtype == np.int64


@pytest.mark.parametrize("op", [
    RandomAffine(25, translate=(0.2, 0.1), scale=(0.5, 1.5), shear=10),
    RandomRotation((-45, 10)),
    RandomPhotometricDistort(),
])
def test_draws_repeat_for_a_seed(op) -> None:
    sample = make_sample()
    a = [op.draw(sample_rng(7, 1, i), sample) for i in range(20)]
    b = [op.draw(sample_rng(7, 1, i), sample) for i in range(20)]
    assert a == b
    assert a != [op.draw(sample_rng(8, 1, i), sample) for i in range(20)]


def test_affine_draws_stay_in_range() -> None:
    op = RandomAffine((-5, 15), translate=(0.25, 0.5), scale=(0.5, 2.0), shear=(-3, 3, 4, 6))
    sample = make_sample()
    for i in range(200):
        p = op.draw(sample_rng(0, 0, i), sample)
        assert -5 <= p["angle"] <= 15 and 0.5 <= p["scale"] <= 2.0
        assert abs(p["translate"][0]) <= round(0.25 * W) and abs(p["translate"][1]) <= round(0.5 * H)
        assert all(isinstance(t, int) for t in p["translate"])
        assert -3 <= p["shear"][0] <= 3 and 4 <= p["shear"][1] <= 6


@pytest.mark.parametrize("make, match", [
    (lambda: RandomAffine(-1), "degrees"),
    (lambda: RandomAffine((10, 5)), "degrees"),
    (lambda: RandomAffine(0, translate=(0.1, 1.5)), "translate"),
    (lambda: RandomAffine(0, scale=(0.0, 1.0)), "scale"),
    (lambda: RandomAffine(0, shear=(1, 2, 3)), "shear"),
    (lambda: RandomAffine(0, interpolation="lanczos"), "interpolation"),
    (lambda: RandomAffine(0, center=(1,)), "center"),
    (lambda: RandomRotation("a"), "degrees"),
    (lambda: RandomRotation(10, expand="yes"), "expand"),
    (lambda: RandomPhotometricDistort(hue=(-0.6, 0.1)), "hue"),
    (lambda: RandomPhotometricDistort(p=2), "p"),
    (lambda: ImageOnly(lambda row: row), "row_op"),
])
def test_arguments_are_checked(make, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_interpolation_takes_pil_ints() -> None:
    assert RandomAffine(0, interpolation=2).interpolation == "bilinear"


def test_fill_reaches_image_and_masks() -> None:
    sample = make_sample()
    op = RandomAffine(0, fill={"Image": (10, 20, 30), "Mask": 7})
    out = op.apply(sample, {**IDENTITY, "translate": (5, 0)})
    assert (out.image[:, :5] == (10, 20, 30)).all()
    assert (out.target["masks"].dense()[:, :, :5] == 7).all()


def test_photometric_distort_draws_and_leaves_targets() -> None:
    sample = make_sample()
    assert RandomPhotometricDistort(p=0.0).draw(sample_rng(0, 0, 0), sample) is None
    op = RandomPhotometricDistort(p=1.0)
    params = op.draw(sample_rng(0, 0, 0), sample)
    assert all(params[f"{k}_factor"] is not None for k in ("brightness", "contrast", "saturation", "hue"))
    assert sorted(params["channel_permutation"]) == [0, 1, 2]
    target = sample.target
    out = op.apply(sample, params)
    assert out.target is target and out.image.shape == (H, W, 3) and out.image.dtype == np.uint8
    only_perm = {"brightness_factor": None, "contrast_factor": None, "saturation_factor": None,
                 "hue_factor": None, "contrast_before": True, "channel_permutation": (2, 0, 1)}
    src = make_sample().image
    np.testing.assert_array_equal(op.apply(make_sample(), only_perm).image, src[..., [2, 0, 1]])


def test_image_only_runs_a_row_op() -> None:
    sample = make_sample()
    target = sample.target
    out = ImageOnly(RandomGrayscale(p=1.0))(sample, sample_rng(0, 0, 0))
    assert out.target is target
    assert (out.image[..., 0] == out.image[..., 1]).all() and (out.image[..., 1] == out.image[..., 2]).all()
    jitter = ImageOnly(ColorJitter(brightness=0.4))
    assert jitter.name == "ColorJitter"
    a = jitter(make_sample(), sample_rng(1, 0, 0)).image
    b = ColorJitter(brightness=0.4)(make_sample().image, sample_rng(1, 0, 0))
    np.testing.assert_array_equal(a, b)
    readonly = make_sample()
    readonly.image.flags.writeable = False
    assert ImageOnly(RandomGrayscale(p=1.0))(readonly, sample_rng(0, 0, 0)).image.shape == (H, W, 3)


def test_half_turn_keeps_a_lazy_mask_lazy() -> None:
    sample = make_sample(lazy=True)
    planes = sample.target["masks"].lazy.data
    out = RandomRotation((180, 180)).apply(sample, {"angle": 180.0})
    mask = out.target["masks"]
    assert mask.lazy is not None
    np.testing.assert_array_equal(mask.dense(), np.rot90(planes, 2, axes=(1, 2)))
    np.testing.assert_array_equal(out.image, np.rot90(make_sample().image, 2, axes=(0, 1)))
