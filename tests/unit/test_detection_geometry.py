"""Properties of the geometric joint ops without torchvision: formats round trip, flipping twice
is the identity, a crop padded back restores the window, a resize's output size follows
torchvision's rule, ``SanitizeBoundingBoxes`` drops the right boxes, labels (numpy, torch,
list) and mask planes, lazy masks read as the dense ones under every op, and the draws are the
same from the same generator. Fidelity to torchvision: tests/torchvision/test_detection_*.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from gpufeed.image.detection._boxes import (
    ClampBoundingBoxes,
    ConvertBoundingBoxFormat,
    SanitizeBoundingBoxes,
    SanitizeKeyPoints,
    SetClampingMode,
    convert_format,
)
from gpufeed.image.detection._crops import (
    CenterCrop,
    Pad,
    RandomCrop,
    RandomIoUCrop,
    RandomResizedCrop,
    RandomZoomOut,
    window_sample,
)
from gpufeed.image.detection._geometry import (
    RandomHorizontalFlip,
    RandomResize,
    RandomShortestSize,
    RandomVerticalFlip,
    Resize,
    ScaleJitter,
    resized_size,
)
from gpufeed.image.detection._sample import Boxes, KeyPoints, Mask, Sample, sample_rng
from gpufeed.synth import photo_like
from tests.unit._planes import ArrayPlanes as Lazy

pytestmark = pytest.mark.timeout(120)
H, W = 60, 80
FORMATS = ("XYXY", "XYWH", "CXCYWH")




def make_sample(fmt: str = "XYXY", seed: int = 0, n: int = 5, lazy: bool = False,
                clamping: str | None = "soft") -> Sample:
    rng = np.random.default_rng(seed)
    xy = rng.uniform([0, 0], [W - 20, H - 20], size=(n, 2))
    xyxy = np.concatenate([xy, xy + rng.uniform(2, 20, size=(n, 2))], axis=1)
    planes = rng.integers(0, 2, size=(n, H, W), dtype=np.uint8)
    return Sample(photo_like(H, W, seed=seed), {
        # float64 leaves: the properties hold exactly (float32 ones round as torchvision's do)
        "boxes": Boxes(convert_format(xyxy, "XYXY", fmt), fmt, (H, W), clamping_mode=clamping,
                       dtype="float64"),
        "masks": Mask(lazy=Lazy(planes)) if lazy else Mask(data=planes),
        "semantic": Mask(data=rng.integers(0, 5, size=(H, W), dtype=np.uint8)),
        "keypoints": KeyPoints(rng.uniform(0, [W - 1, H - 1], size=(n, 2, 2)), (H, W), dtype="float64"),
        "labels": np.arange(n) + 1,
    })


def test_formats_round_trip():
    rng = np.random.default_rng(0)
    xyxy = np.sort(rng.uniform(0, 100, size=(20, 4)).reshape(20, 2, 2), axis=1).transpose(0, 2, 1).reshape(20, 4)
    for a in FORMATS:
        for b in FORMATS:
            there = convert_format(xyxy, "XYXY", a)
            back = convert_format(convert_format(there, a, b), b, "XYXY")
            np.testing.assert_allclose(back, xyxy, atol=1e-9)
    np.testing.assert_allclose(convert_format([[10, 20, 30, 60]], "XYXY", "CXCYWH"), [[20, 40, 20, 40]])
    np.testing.assert_allclose(convert_format([[10, 20, 30, 60]], "XYXY", "XYWH"), [[10, 20, 20, 40]])
    sample = make_sample("XYWH")
    out = ConvertBoundingBoxFormat("cxcywh")(sample, np.random.default_rng(0))
    assert out.target["boxes"].format == "CXCYWH"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("op", [RandomHorizontalFlip(p=1.0), RandomVerticalFlip(p=1.0)], ids=lambda o: o.name)
def test_flip_twice_is_identity(fmt, op):
    sample = make_sample(fmt)
    rng = np.random.default_rng(0)
    once = op(sample, rng)
    assert not np.array_equal(once.image, sample.image)
    twice = op(once, rng)
    assert np.array_equal(twice.image, sample.image)
    np.testing.assert_allclose(twice.target["boxes"].data, sample.target["boxes"].data, atol=1e-9)
    np.testing.assert_allclose(twice.target["keypoints"].data, sample.target["keypoints"].data, atol=1e-9)
    assert np.array_equal(twice.target["masks"].dense(), sample.target["masks"].dense())
    assert np.array_equal(twice.target["semantic"].dense(), sample.target["semantic"].dense())


def test_flip_moves_boxes_and_points_with_pixels():
    sample = make_sample("XYXY")
    out = RandomHorizontalFlip(p=1.0)(sample, np.random.default_rng(0))
    x1, _, x2, _ = sample.target["boxes"].data[0]
    np.testing.assert_allclose(out.target["boxes"].data[0, [0, 2]], [W - x2, W - x1])
    np.testing.assert_allclose(out.target["keypoints"].data[..., 0], W - 1 - sample.target["keypoints"].data[..., 0])
    assert np.array_equal(out.target["semantic"].dense(), sample.target["semantic"].dense()[:, ::-1])
    assert RandomHorizontalFlip(p=0.0).draw(np.random.default_rng(0), sample) is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_crop_then_pad_restores_the_window(fmt):
    sample = make_sample(fmt, clamping=None)
    top, left, h, w = 7, 11, 30, 40
    crop = window_sample(sample, top, left, h, w)
    assert crop.image.shape == (h, w, 3) and crop.target["boxes"].canvas == (h, w)
    back = Pad([left, top, W - left - w, H - top - h], fill=0)(crop, np.random.default_rng(0))
    assert back.size == (H, W) and back.target["boxes"].canvas == (H, W)
    np.testing.assert_allclose(back.target["boxes"].data, sample.target["boxes"].data, atol=1e-9)
    np.testing.assert_allclose(back.target["keypoints"].data, sample.target["keypoints"].data, atol=1e-9)
    inside = (slice(top, top + h), slice(left, left + w))
    assert np.array_equal(back.image[inside], sample.image[inside])
    assert (back.image[:top] == 0).all() and (back.image[:, left + w:] == 0).all()
    masks, original = back.target["masks"].dense(), sample.target["masks"].dense()
    assert np.array_equal(masks[:, inside[0], inside[1]], original[:, inside[0], inside[1]])
    assert (masks[:, :top] == 0).all()


def test_crop_clamps_boxes_by_their_mode():
    boxes = Boxes([[5, 5, 50, 50]], "XYXY", (H, W), clamping_mode="soft")
    sample = Sample(np.zeros((H, W, 3), np.uint8), {"boxes": boxes})
    out = window_sample(sample, 10, 20, 20, 20)
    np.testing.assert_allclose(out.target["boxes"].data, [[0, 0, 20, 20]])
    sample.target["boxes"] = Boxes([[5, 5, 50, 50]], "XYXY", (H, W), clamping_mode=None)
    out = window_sample(sample, 10, 20, 20, 20)
    np.testing.assert_allclose(out.target["boxes"].data, [[-15, -5, 30, 40]])
    clamped = ClampBoundingBoxes("hard")(out, np.random.default_rng(0))
    np.testing.assert_allclose(clamped.target["boxes"].data, [[0, 0, 20, 20]])


def test_resized_size_follows_torchvision():
    assert resized_size((480, 640), [240]) == (240, 320)
    assert resized_size((480, 640), 240, max_size=300) == (225, 300)
    assert resized_size((640, 480), None, max_size=320) == (320, 240)
    assert resized_size((480, 640), (100, 50)) == (100, 50)
    assert resized_size((333, 500), [200]) == (200, 300)
    with pytest.raises(ValueError, match="max_size"):
        resized_size((480, 640), [240], max_size=240)


def test_resize_scales_boxes_points_and_masks():
    sample = make_sample("XYWH")
    out = Resize((30, 160))(sample, np.random.default_rng(0))
    assert out.image.shape == (30, 160, 3)
    np.testing.assert_allclose(out.target["boxes"].data, sample.target["boxes"].data * [2, 0.5, 2, 0.5])
    assert out.target["boxes"].canvas == (30, 160) and out.target["keypoints"].canvas == (30, 160)
    semantic = sample.target["semantic"].dense()
    assert np.array_equal(out.target["semantic"].dense(), semantic[::2].repeat(2, axis=1))


def test_sanitize_drops_boxes_labels_and_planes():
    sample = make_sample("XYXY", n=6)
    sample.target["boxes"].data[[1, 4]] = [[5, 5, 5.5, 30], [-1, 3, 10, 10]]
    for labels in (np.arange(6) + 1, torch.arange(6) + 1, list(range(1, 7))):
        sample.target["labels"] = labels
        out = SanitizeBoundingBoxes()(sample, np.random.default_rng(0))
        kept = [0, 2, 3, 5]
        assert list(np.asarray(out.target["labels"])) == [k + 1 for k in kept]
        assert type(out.target["labels"]) is type(labels)
        np.testing.assert_array_equal(out.target["boxes"].data, sample.target["boxes"].data[kept])
        assert np.array_equal(out.target["masks"].dense(), sample.target["masks"].dense()[kept])
        assert out.target["semantic"].dense().shape == (H, W)  # not one entry per box: unchanged
        assert out.target["keypoints"] is sample.target["keypoints"]


def test_sanitize_labels_getter_options():
    sample = make_sample(n=3)
    sample.target["boxes"].data[0] = [0, 0, 0.5, 0.5]
    sample.target["class_label"] = sample.target.pop("labels")
    out = SanitizeBoundingBoxes()(sample, np.random.default_rng(0))
    assert list(out.target["class_label"]) == [2, 3]
    out = SanitizeBoundingBoxes(labels_getter=None)(sample, np.random.default_rng(0))
    assert list(out.target["class_label"]) == [1, 2, 3] and len(out.target["boxes"]) == 2
    out = SanitizeBoundingBoxes(labels_getter=lambda inputs: inputs[1]["class_label"])(
        sample, np.random.default_rng(0))
    assert list(out.target["class_label"]) == [2, 3]
    del sample.target["class_label"]
    with pytest.raises(ValueError, match="labels"):
        SanitizeBoundingBoxes()(sample, np.random.default_rng(0))
    with pytest.raises(ValueError, match="min_size"):
        SanitizeBoundingBoxes(min_size=0.5)


OPS: list[Any] = [
    RandomHorizontalFlip(p=1.0), RandomVerticalFlip(p=1.0), Resize([45]), Resize((90, 50)),
    Resize([40], interpolation="nearest"), CenterCrop(30), CenterCrop((70, 90)),
    RandomCrop(40, padding=3, pad_if_needed=True, fill={"Mask": 255, "others": 1}),
    RandomResizedCrop(32), Pad([3, 1, 4, 1]), Pad(5, padding_mode="reflect"),
    RandomZoomOut(fill={"Image": (9, 8, 7), "Mask": 0}, p=1.0), RandomIoUCrop(),
    ScaleJitter((100, 80)), RandomShortestSize([30, 50], max_size=90), RandomResize(20, 70),
    SanitizeBoundingBoxes(),
]


@pytest.mark.parametrize("op", OPS, ids=lambda o: repr(o))
def test_lazy_mask_reads_as_dense(op):
    for seed in range(3):
        dense, lazy = make_sample(seed=seed), make_sample(seed=seed, lazy=True)
        if op.name == "Pad" and op.padding_mode != "constant":
            for s in (dense, lazy):
                del s.target["boxes"], s.target["keypoints"]
        params = op.draw(sample_rng(0, 0, seed), dense)
        if params is None:
            continue
        a, b = op.apply(dense, params), op.apply(lazy, params)
        assert np.array_equal(a.target["masks"].dense(), b.target["masks"].dense())
        assert np.array_equal(a.image, b.image)


@pytest.mark.parametrize("op", OPS, ids=lambda o: repr(o))
def test_draws_repeat_from_the_same_generator(op):
    sample = make_sample()
    first = [op.draw(sample_rng(3, 1, i), sample) for i in range(20)]
    again = [op.draw(sample_rng(3, 1, i), sample) for i in range(20)]
    assert repr(first) == repr(again)


def test_pad_fills_image_and_masks():
    sample = make_sample()
    out = Pad([2, 0, 0, 0], fill={"Image": (10, 20, 30.7), "Mask": 255})(sample, np.random.default_rng(0))
    assert (out.image[:, :2] == [10, 20, 30]).all()
    assert (out.target["masks"].dense()[:, :, :2] == 255).all()
    with pytest.raises(ValueError, match="mask `fill`"):
        Pad(2, fill=(1, 2, 3))(sample, np.random.default_rng(0))
    with pytest.raises(ValueError, match="not supported with bounding boxes"):
        Pad(2, padding_mode="edge")(sample, np.random.default_rng(0))


@pytest.mark.parametrize("make", [
    lambda: Resize(None), lambda: Resize((10, 20), max_size=30), lambda: Resize(10, interpolation="lanczos"),
    lambda: RandomHorizontalFlip(p=1.5), lambda: Pad([1, 2, 3]), lambda: Pad(1, padding_mode="wrap"),
    lambda: RandomZoomOut(side_range=(0.5, 2)), lambda: RandomResize(10, 10), lambda: ClampBoundingBoxes("x"),
    lambda: ConvertBoundingBoxFormat("XYXYXYXY"), lambda: RandomIoUCrop(trials=0),
    lambda: SanitizeBoundingBoxes(labels_getter="labels"),
])
def test_bad_arguments_fail_at_construction(make):
    with pytest.raises((ValueError, TypeError)):
        make()


def test_iou_crop_zeroes_boxes_whose_centres_leave():
    sample = make_sample(n=8)
    op = RandomIoUCrop()
    rng = np.random.default_rng(4)
    for _ in range(50):
        params = op.draw(rng, sample)
        if params is not None and not params["inside"].all():
            break
    out = op.apply(sample, params)
    assert (out.target["boxes"].data[~params["inside"]] == 0).all()
    assert out.target["boxes"].canvas == (params["height"], params["width"])
    assert params["inside"].any()


@pytest.mark.parametrize("second_fill", [False, True])
def test_chains_of_ops_keep_lazy_masks_lazy_and_equal_to_dense(second_fill):
    chain = [RandomZoomOut(fill={"Image": (1, 2, 3), "Mask": 255}, p=1.0), RandomIoUCrop(),
             RandomHorizontalFlip(p=1.0), Resize((50, 50)), CenterCrop(40),
             RandomCrop(30, padding=2 if second_fill else None), SanitizeBoundingBoxes()]
    for seed in range(5):
        dense, lazy = make_sample(seed=seed), make_sample(seed=seed, lazy=True)
        for op in chain:
            params = op.draw(sample_rng(1, 0, seed), dense)
            if params is not None:
                dense, lazy = op.apply(dense, params), op.apply(lazy, params)
        if not second_fill:  # only a second fill value (0 after 255) may materialise it
            assert lazy.target["masks"].lazy is not None
        assert np.array_equal(lazy.target["masks"].dense(), dense.target["masks"].dense())
        assert np.array_equal(lazy.image, dense.image)


def test_sanitize_keypoints_drops_groups_with_a_point_outside():
    sample = make_sample(n=4)
    sample.target["keypoints"].data[1, 0] = [W, 3]  # x == W is outside
    sample.target["keypoints"].data[3, 1] = [2, -0.1]
    out = SanitizeKeyPoints(labels_getter="default")(sample, np.random.default_rng(0))
    np.testing.assert_array_equal(out.target["keypoints"].data, sample.target["keypoints"].data[[0, 2]])
    assert list(out.target["labels"]) == [1, 3]
    assert len(out.target["boxes"]) == 4
    out = SanitizeKeyPoints()(sample, np.random.default_rng(0))
    assert list(out.target["labels"]) == [1, 2, 3, 4]


def test_set_clamping_mode_changes_what_a_crop_does():
    sample = make_sample()
    loose = SetClampingMode(None)(sample, np.random.default_rng(0))
    assert loose.target["boxes"].clamping_mode is None
    out = window_sample(loose, 20, 30, 10, 10)
    assert (out.target["boxes"].data < 0).any()
    with pytest.raises(ValueError, match="clamping_mode"):
        SetClampingMode("auto")


def test_iou_crop_without_boxes_ends():
    sample = Sample(np.zeros((H, W, 3), np.uint8), {"boxes": Boxes(np.zeros((0, 4)), "XYXY", (H, W))})
    assert RandomIoUCrop(sampler_options=[0.5]).draw(np.random.default_rng(0), sample) is None
    assert RandomIoUCrop().draw(np.random.default_rng(0), sample) is None
    with pytest.raises(TypeError, match="bounding boxes"):
        RandomIoUCrop().draw(np.random.default_rng(0), Sample(sample.image, {}))


def test_float32_leaves_round_after_each_op_as_torchvision_computes_them():
    rng = np.random.default_rng(5)
    xyxy = np.sort(rng.uniform(0, W, (50, 4)), axis=1).astype(np.float32)
    points = rng.uniform(0, W - 1, (50, 2)).astype(np.float32)
    sample = Sample(photo_like(H, W, seed=5), {"boxes": Boxes(xyxy, "XYXY", (H, W), clamping_mode=None),
                                               "points": KeyPoints(points, (H, W))})
    out = Resize((37, 53))(RandomHorizontalFlip(1.0)(sample, rng), rng)
    # torchvision in float32: W - x (each op's result in float32), then * float32(new / old)
    flipped = np.stack([np.float32(W) - xyxy[:, 2], xyxy[:, 1], np.float32(W) - xyxy[:, 0], xyxy[:, 3]], 1)
    want = flipped * np.array([53 / W, 37 / H, 53 / W, 37 / H], np.float32)
    assert out.target["boxes"].data.astype(np.float32).tolist() == want.tolist()
    px = np.stack([np.float32(W - 1) - points[:, 0], points[:, 1]], 1)
    want_points = px * np.array([53 / W, 37 / H], np.float32)
    assert out.target["points"].data.astype(np.float32).tolist() == want_points.tolist()


def test_pil_nearest_index_picks_pils_own_pixels():
    """A resize before the conversion to tensor runs on torchvision's PIL image, with PIL's
    nearest pixels: the accumulated step, which is neither torch's nearest nor nearest-exact."""
    from PIL import Image

    from gpufeed.image.detection._geometry import PIL_NEAREST, nearest_exact_index, pil_nearest_index, resize_image

    rng = np.random.default_rng(0)
    differs_from_exact = 0
    for _ in range(150):
        (h, w), (oh, ow) = rng.integers(2, 500, 2).tolist(), rng.integers(1, 700, 2).tolist()
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = np.asarray(Image.fromarray(img).resize((ow, oh), Image.NEAREST))
        np.testing.assert_array_equal(resize_image(img, oh, ow, PIL_NEAREST), want, err_msg=f"{(h, w)} -> {(oh, ow)}")
        differs_from_exact += not (np.array_equal(pil_nearest_index(h, oh), nearest_exact_index(h, oh))
                                   and np.array_equal(pil_nearest_index(w, ow), nearest_exact_index(w, ow)))
    assert differs_from_exact > 10  # the reason for an index of its own
