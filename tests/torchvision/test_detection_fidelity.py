"""The geometric joint ops against torchvision v2's kernels given the same parameters: each op
draws its parameters (``draw``), applies them (``apply``), and the same parameters go to the
torchvision op's ``transform`` (its functional kernels) on ``tv_tensors`` built from the same
sample. Boxes (in every format, under each clamping mode) and keypoints within 1e-3 px with the
same canvas, masks (N planes and one plane) pixel for pixel, images exact except after resizes
(mean absolute difference <= 0.5 levels: OpenCV enlarges, rounding differently).
Needs torchvision (.venv-tv)."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from gpufeed.image.detection import _affine, _boxes, _crops, _geometry  # noqa: E402
from gpufeed.image.detection._boxes import convert_format  # noqa: E402
from gpufeed.image.detection._sample import Boxes, KeyPoints, Mask, Sample  # noqa: E402
from gpufeed.synth import photo_like  # noqa: E402

pytestmark = pytest.mark.timeout(300)
H, W = 240, 320
FORMATS = ("XYXY", "XYWH", "CXCYWH")
CLAMPING = ("soft", "hard", None)
RESIZES = {"Resize", "RandomResizedCrop", "ScaleJitter", "RandomShortestSize", "RandomResize"}


def ours(name: str, *args: Any, **kwargs: Any) -> Any:
    for module in (_boxes, _geometry, _crops):
        if hasattr(module, name):
            return getattr(module, name)(*args, **kwargs)
    raise AssertionError(name)


def make_sample(seed: int, fmt: str, clamping: str | None, n: int = 6) -> Sample:
    rng = np.random.default_rng(seed)
    image = photo_like(H, W, seed=seed, noise=3.0)
    xy = rng.uniform([-20, -20], [W, H], size=(n, 2))
    wh = rng.uniform(2, 120, size=(n, 2))
    xyxy = np.concatenate([xy, xy + wh], axis=1)
    planes = np.zeros((n, H, W), np.uint8)
    for i, (x0, y0, x1, y1) in enumerate(np.clip(xyxy, 0, None).astype(int)):
        planes[i, y0:y1, x0:x1] = 1 + i
    semantic = rng.integers(0, 6, size=(H // 8, W // 8), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    points = rng.uniform([-5, -5], [W + 5, H + 5], size=(n, 3, 2))
    return Sample(image, {
        "boxes": Boxes(convert_format(xyxy, "XYXY", fmt), fmt, (H, W), clamping_mode=clamping),
        "masks": Mask(data=planes),
        "semantic": Mask(data=semantic),
        "keypoints": KeyPoints(points, (H, W)),
        "labels": np.arange(n, dtype=np.int64) + 1,
        "image_id": 7,
    })


def to_tv(sample: Sample) -> tuple[Any, dict[str, Any]]:
    target: dict[str, Any] = {}
    for key, leaf in sample.target.items():
        if isinstance(leaf, Boxes):
            target[key] = tv_tensors.BoundingBoxes(torch.from_numpy(leaf.data.astype(leaf.dtype)),
                                                   format=leaf.format, canvas_size=leaf.canvas,
                                                   clamping_mode=leaf.clamping_mode)
        elif isinstance(leaf, Mask):
            target[key] = tv_tensors.Mask(torch.from_numpy(np.ascontiguousarray(leaf.dense())))
        elif isinstance(leaf, KeyPoints):
            target[key] = tv_tensors.KeyPoints(torch.from_numpy(leaf.data.astype(leaf.dtype)),
                                               canvas_size=leaf.canvas)
        elif isinstance(leaf, np.ndarray):
            target[key] = torch.from_numpy(leaf)
        else:
            target[key] = leaf
    image = tv_tensors.Image(torch.from_numpy(np.ascontiguousarray(sample.image)).permute(2, 0, 1))
    return image, target


def compare(got: Sample, image: Any, target: dict[str, Any], resized: bool, what: str) -> None:
    want_img = image.permute(1, 2, 0).numpy()
    assert got.image.shape == want_img.shape, what
    diff = np.abs(got.image.astype(np.int16) - want_img.astype(np.int16))
    if resized:
        assert diff.mean() <= 0.5, f"{what}: image mean abs diff {diff.mean():.3f}"
    else:
        assert diff.max() == 0, f"{what}: image differs by up to {diff.max()}"
    for key, want in target.items():
        leaf = got.target[key]
        if isinstance(want, tv_tensors.BoundingBoxes):
            assert leaf.canvas == tuple(want.canvas_size), f"{what}: {key} canvas"
            assert leaf.format == want.format.name, f"{what}: {key} format"
            assert leaf.clamping_mode == want.clamping_mode, f"{what}: {key} clamping mode"
            np.testing.assert_allclose(leaf.data, want.numpy().reshape(-1, 4), atol=1e-3, rtol=0,
                                       err_msg=f"{what}: {key}")
        elif isinstance(want, tv_tensors.KeyPoints):
            assert leaf.canvas == tuple(want.canvas_size), f"{what}: {key} canvas"
            np.testing.assert_allclose(leaf.data, want.numpy(), atol=1e-3, rtol=0, err_msg=f"{what}: {key}")
        elif isinstance(want, tv_tensors.Mask):
            dense = leaf.dense()
            assert dense.shape == tuple(want.shape), f"{what}: {key} shape {dense.shape} vs {tuple(want.shape)}"
            assert np.array_equal(dense, want.numpy()), f"{what}: {key} pixels"
        elif isinstance(want, torch.Tensor):
            assert np.array_equal(np.asarray(leaf), want.numpy()), f"{what}: {key}"
        else:
            assert leaf == want, f"{what}: {key}"


def tv_params(name: str, params: dict[str, Any], op: Any) -> dict[str, Any]:
    """Our parameters as the torchvision op's ``make_params`` would have returned them."""
    if name == "RandomCrop":
        return {"needs_crop": params["crop"], "top": params["top"], "left": params["left"],
                "height": op.size[0], "width": op.size[1], "needs_pad": any(params["padding"]),
                "padding": params["padding"]}
    if name == "RandomIoUCrop":
        return {"top": params["top"], "left": params["left"], "height": params["height"],
                "width": params["width"], "is_within_crop_area": torch.from_numpy(params["inside"])}
    return dict(params)


def run_tv(op: Any, params: dict[str, Any], image: Any, target: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    def one(x: Any) -> Any:
        if isinstance(x, (tv_tensors.Image, tv_tensors.BoundingBoxes, tv_tensors.Mask, tv_tensors.KeyPoints)):
            return op.transform(x, params)
        return x

    return one(image), {k: one(v) for k, v in target.items()}


CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("RandomHorizontalFlip", (), {"p": 1.0}),
    ("RandomVerticalFlip", (), {"p": 1.0}),
    ("Resize", ([150],), {}),
    ("Resize", ((120, 200),), {}),
    ("Resize", ((500, 700),), {}),
    ("Resize", ((80, 160),), {}),
    ("Resize", ((300, 150),), {"interpolation": "bicubic"}),
    ("Resize", ((300, 400),), {"interpolation": "bicubic", "antialias": False}),
    ("Resize", (100,), {"max_size": 130}),
    ("Resize", (None,), {"max_size": 170}),
    ("Resize", ([90],), {"interpolation": V.InterpolationMode.NEAREST}),
    ("Resize", ([190],), {"interpolation": "nearest-exact"}),
    ("Resize", ([200],), {"antialias": False}),
    ("CenterCrop", (100,), {}),
    ("CenterCrop", ((H + 3, 50),), {}),
    ("CenterCrop", ((H + 7, W + 4),), {}),
    ("RandomCrop", (100,), {"padding": [3, 5], "pad_if_needed": True,
                            "fill": {tv_tensors.Mask: 255, "others": 7}}),
    ("RandomCrop", ((H + 10, 50),), {"pad_if_needed": True}),
    ("RandomResizedCrop", (96,), {}),
    ("RandomResizedCrop", ((80, 120),), {"scale": (0.5, 1.0), "interpolation": "bicubic"}),
    ("Pad", ([3, 4, 5, 6],), {"fill": {tv_tensors.Image: (1, 2, 3), tv_tensors.Mask: 9}}),
    ("Pad", ([2, 7],), {"fill": 127.5}),
    ("Pad", ([-3, 2, 4, -5],), {"fill": {tv_tensors.Mask: 3, "others": 50}}),
    ("RandomZoomOut", (), {"fill": {tv_tensors.Image: (123, 117, 104), tv_tensors.Mask: 0}, "p": 1.0}),
    ("RandomIoUCrop", (), {}),
    ("ScaleJitter", ((300, 200),), {}),
    ("RandomShortestSize", ([80, 120, 300],), {"max_size": 360}),
    ("RandomResize", (60, 200), {}),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[1]}{sorted(c[2])}")
def test_op_matches_torchvision(case, fmt):
    name, args, kwargs = case
    mine, theirs = ours(name, *args, **kwargs), getattr(V, name)(*args, **kwargs)
    for seed in range(3):
        clamping = CLAMPING[seed]
        sample = make_sample(seed, fmt, clamping)
        image, target = to_tv(sample)
        params = mine.draw(np.random.default_rng(seed), sample)
        what = f"{name} {fmt} clamping={clamping} seed={seed} params={params}"
        if params is None:
            continue
        want_image, want_target = run_tv(theirs, tv_params(name, params, theirs), image, target)
        got = mine.apply(sample, params)
        compare(got, want_image, want_target, name in RESIZES, what)


@pytest.mark.parametrize("mode", ["edge", "reflect", "symmetric"])
def test_pad_modes_image_and_masks(mode):
    sample = make_sample(3, "XYXY", "soft")
    del sample.target["boxes"], sample.target["keypoints"]
    image, target = to_tv(sample)
    mine, theirs = ours("Pad", [3, 5, 7, 2], padding_mode=mode), V.Pad([3, 5, 7, 2], padding_mode=mode)
    want_image, want_target = run_tv(theirs, {}, image, target)
    compare(mine.apply(sample, mine.draw(np.random.default_rng(0), sample)), want_image, want_target,
            False, mode)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("clamping", CLAMPING)
def test_box_ops_match_torchvision(fmt, clamping):
    for seed in range(3):
        sample = make_sample(seed, fmt, clamping, n=12)
        # Degenerate and tiny boxes for the sanitizer.
        sample.target["boxes"].data[:3] = convert_format(
            np.array([[5, 5, 5, 30], [10, 10, 10.5, 40], [-3, 4, 20, 30]]), "XYXY", fmt)
        image, target = to_tv(sample)
        cases = [("ConvertBoundingBoxFormat", (new,), {}) for new in FORMATS]
        cases += [("ClampBoundingBoxes", (mode,), {}) for mode in ("auto", "soft", None)]
        cases += [("ClampKeyPoints", (), {}), ("SanitizeBoundingBoxes", (), {}),
                  ("SanitizeBoundingBoxes", (), {"min_size": 20, "min_area": 500}),
                  ("SanitizeKeyPoints", (), {}), ("SanitizeKeyPoints", (), {"labels_getter": "default"}),
                  ("SetClampingMode", ("hard",), {}), ("SetClampingMode", (None,), {})]
        for name, args, kwargs in cases:
            mine, theirs = ours(name, *args, **kwargs), getattr(V, name)(*args, **kwargs)
            want_image, want_target = theirs(image, target)
            got = mine(sample, np.random.default_rng(0))
            compare(got, want_image, want_target, False, f"{name}{args} {fmt} {clamping} seed={seed}")


class _LazyPlanes:
    """Instance planes read out only where asked, as COCO's masks are."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.data.shape

    def pixels(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self.data[:, rows[:, None], cols[None, :]]


def test_lazy_planes_match_dense_through_sanitize_and_crop():
    sample = make_sample(5, "XYXY", "soft", n=8)
    sample.target["boxes"].data[:2] = [[5, 5, 5, 30], [10, 10, 10.5, 40]]
    image, target = to_tv(sample)
    sample.target["masks"] = Mask(lazy=_LazyPlanes(sample.target["masks"].data))
    pipeline = [("RandomIoUCrop", (), {}), ("SanitizeBoundingBoxes", (), {})]
    for name, args, kwargs in pipeline:
        mine, theirs = ours(name, *args, **kwargs), getattr(V, name)(*args, **kwargs)
        params = mine.draw(np.random.default_rng(1), sample)
        if params is None:
            continue
        if name == "SanitizeBoundingBoxes":
            image, target = theirs(image, target)
        else:
            image, target = run_tv(theirs, tv_params(name, params, theirs), image, target)
        sample = mine.apply(sample, params)
    compare(sample, image, target, False, "lazy")


def test_ops_given_torchvision_objects_pickle_without_them():
    ops = [ours("Resize", [100], interpolation=V.InterpolationMode.BICUBIC),
           ours("RandomZoomOut", fill={tv_tensors.Image: (1, 2, 3), tv_tensors.Mask: 255}),
           ours("ConvertBoundingBoxFormat", tv_tensors.BoundingBoxFormat.CXCYWH),
           ours("RandomResizedCrop", 32, interpolation=V.InterpolationMode.NEAREST_EXACT)]
    for op in ops:
        assert b"torchvision" not in pickle.dumps(op), op
    assert ops[0].interpolation == "bicubic" and ops[1].fill == {"Image": (1, 2, 3), "Mask": 255}


def int_boxes_sample(seed: int, fmt: str, clamping: str | None, n: int = 8) -> Sample:
    """int64 boxes (a COCO file whose boxes are whole numbers gives them, through torchvision's
    wrapper), some touching the canvas' edges, where float64 and float32 products part."""
    rng = np.random.default_rng(100 + seed)
    x0, y0 = rng.integers(0, W - 10, n), rng.integers(0, H - 10, n)
    x1 = np.minimum(x0 + rng.integers(1, 200, n), W)
    y1 = np.minimum(y0 + rng.integers(1, 200, n), H)
    x1[: n // 2], y1[: n // 2] = W, H  # on the right and bottom edges
    xyxy = np.stack([x0, y0, x1, y1], 1).astype(np.float64)
    if fmt == "CXCYWH":  # torchvision's integer conversion: floor division of the sums
        xyxy[:, 2:] += (xyxy[:, 2:] - xyxy[:, :2]) % 2  # even sizes: whole centres
    boxes = Boxes(convert_format(xyxy, "XYXY", fmt), fmt, (H, W), clamping_mode=clamping, dtype="int64")
    return Sample(photo_like(H, W, seed=seed, noise=3.0), {"boxes": boxes})


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[1]}{sorted(c[2])}")
def test_integer_boxes_equal_torchvisions_exactly(case, fmt):
    """Integer boxes come out as torchvision's: resized in float32 and cast back (towards zero)
    after every op, not kept in float64 until the output stage."""
    name, args, kwargs = case
    mine, theirs = ours(name, *args, **kwargs), getattr(V, name)(*args, **kwargs)
    for seed in range(3):
        sample = int_boxes_sample(seed, fmt, CLAMPING[seed])
        leaf = sample.target["boxes"]
        want_boxes = tv_tensors.BoundingBoxes(torch.from_numpy(leaf.data.astype(np.int64)), format=fmt,
                                              canvas_size=(H, W), clamping_mode=leaf.clamping_mode)
        image = tv_tensors.Image(torch.from_numpy(np.ascontiguousarray(sample.image)).permute(2, 0, 1))
        params = mine.draw(np.random.default_rng(seed), sample)
        if params is None:
            continue
        _, want = run_tv(theirs, tv_params(name, params, theirs), image, {"boxes": want_boxes})
        got = mine.apply(sample, params).target["boxes"]
        assert want["boxes"].dtype == torch.int64
        assert got.canvas == tuple(want["boxes"].canvas_size)
        np.testing.assert_array_equal(got.data.astype(np.int64), want["boxes"].numpy(),
                                      err_msg=f"{name} {fmt} seed={seed} params={params}")


@pytest.mark.parametrize("name, args", [("Pad", ([2, 7],)), ("Pad", ([3, -4, 5, 6],)), ("CenterCrop", (100,)),
                                        ("CenterCrop", ((260, 90),))])
def test_pad_and_center_crop_after_an_expanding_rotation_follow_the_boxes_canvas(name, args):
    """After ``RandomRotation(expand=True)`` torchvision's boxes and keypoints can have a canvas a
    pixel off the image's; its pad and centre-crop kernels then work from that canvas (a pad adds
    to it, a centre crop takes its anchor from it), so ours do too."""
    rotate = _affine.RandomRotation(degrees=(-170, 170), expand=True)
    mine, theirs = ours(name, *args), getattr(V, name)(*args)
    off = 0
    for seed in range(12):
        sample = make_sample(seed, FORMATS[seed % 3], CLAMPING[seed % 3])
        params = rotate.draw(np.random.default_rng(seed), sample)
        sample = rotate.apply(sample, params)  # test_detection_affine_fidelity checks this step
        image, target = to_tv(sample)
        off += sample.target["boxes"].canvas != sample.size
        compare(mine.apply(sample, mine.draw(np.random.default_rng(0), sample)),
                *run_tv(theirs, {}, image, target), False, f"{name}{args} seed={seed} {params}")
    assert off >= 3, "no rotation left the boxes' canvas off the image's: the test checks nothing"


CHAIN_OPS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    *CASES, ("RandomAffine", (), dict(degrees=30, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10))),
    ("RandomRotation", (), dict(degrees=(-170, 170), expand=True)), ("RandomRotation", (), dict(degrees=(180, 180))),
    ("SanitizeBoundingBoxes", (), {}), ("ClampBoundingBoxes", (), {}), ("ClampKeyPoints", (), {})]


def _chain_op(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    if name in ("RandomAffine", "RandomRotation"):
        return getattr(_affine, name)(*args, **kwargs), getattr(V, name)(*args, **kwargs)
    return ours(name, *args, **kwargs), getattr(V, name)(*args, **kwargs)


@pytest.mark.parametrize("start", range(0, 240, 40))
def test_random_op_chains_give_torchvisions_boxes_bit_for_bit(start):
    """Random chains of 2-5 joint ops (every geometric op, sanitize and clamp), float32 and int64
    boxes in each format and clamping mode: boxes and keypoints equal torchvision's bit for bit
    (its kernels compute in float32 step by step; float64 steps put a box on the canvas' edge on
    the other side of it now and then, and ``SanitizeBoundingBoxes`` then kept another set; an
    int64 CXCYWH box is converted in float32 and truncated), masks (dense or read out lazily)
    pixel for pixel."""
    pick = np.random.default_rng(start)
    for t in range(start, start + 40):
        chain = [CHAIN_OPS[i] for i in pick.choice(len(CHAIN_OPS), int(pick.integers(2, 6)))]
        sample = make_sample(t, FORMATS[t % 3], CLAMPING[(t // 3) % 3])
        if t % 4 == 3:  # whole-number boxes and keypoints: int64 leaves, as torchvision's COCO wrapper can give
            for key in ("boxes", "keypoints"):
                leaf = sample.target[key]
                sample.target[key] = dataclasses.replace(leaf, data=np.trunc(leaf.data), dtype="int64")
        image, target = to_tv(sample)
        if t % 2:
            sample.target["masks"] = Mask(lazy=_LazyPlanes(sample.target["masks"].data))
        for k, (name, args, kwargs) in enumerate(chain):
            mine, theirs = _chain_op(name, args, kwargs)
            if name in ("SanitizeBoundingBoxes", "ClampBoundingBoxes", "ClampKeyPoints"):
                image, target = theirs(image, target)
                sample = mine(sample, np.random.default_rng(t))
                continue
            params = mine.draw(np.random.default_rng(10 * t + k), sample)
            if params is not None:
                image, target = run_tv(theirs, tv_params(name, params, theirs), image, target)
                sample = mine.apply(sample, params)
        what = f"chain {t}: {[c[0] for c in chain]}"
        for key in ("boxes", "keypoints"):
            np.testing.assert_array_equal(sample.target[key].data.reshape(target[key].shape), target[key].numpy(),
                                          err_msg=f"{what}: {key}")
            assert sample.target[key].canvas == tuple(target[key].canvas_size), what
        for key in ("masks", "semantic", "labels"):
            got = sample.target[key]
            got = got.dense() if isinstance(got, Mask) else np.asarray(got)
            assert np.array_equal(got, target[key].numpy()), f"{what}: {key}"
        assert sample.image.shape[:2] == tuple(image.shape[-2:]), what


@pytest.mark.parametrize("fmt", ["XYWH", "CXCYWH"])
def test_boxes_clamped_to_the_edge_are_sanitized_as_torchvision_sanitizes_them(fmt):
    """Boxes over the right and bottom edges, clamped there, then sanitized: torchvision's
    float32 round trip through XYXY puts some of them past the edge (about 5% in CXCYWH) and
    drops those; the same ones are dropped here, no more and no others."""
    rng = np.random.default_rng(7)
    xy = rng.uniform(0, [W - 2, H - 2], size=(400, 2))
    xyxy = np.concatenate([xy, xy + rng.uniform([W, H], [W + 50, H + 50]) - xy * 0.5], axis=1)
    sample = Sample(photo_like(H, W, seed=1), {"boxes": Boxes(convert_format(xyxy, "XYXY", fmt), fmt, (H, W),
                                                              clamping_mode=None),
                                                "labels": np.arange(400)})
    image, target = to_tv(sample)
    for name, args in (("ClampBoundingBoxes", ("hard",)), ("SanitizeBoundingBoxes", ())):
        image, target = getattr(V, name)(*args)(image, target)
        sample = ours(name, *args)(sample, np.random.default_rng(0))
    assert 0 < len(target["labels"]) < 400 or fmt == "XYWH"
    np.testing.assert_array_equal(sample.target["labels"], target["labels"].numpy())
    np.testing.assert_array_equal(sample.target["boxes"].data, target["boxes"].numpy())


def test_int64_cxcywh_boxes_convert_and_sanitize_as_torchvision():
    """torchvision converts an int64 CXCYWH box to XYXY in float32 and casts it back (towards
    zero): a box of odd size whose edge lands on -0.5 is at 0 and kept by the sanitizer."""
    rng = np.random.default_rng(3)
    wh = rng.integers(1, 40, size=(300, 2)) | 1  # odd sizes: half-pixel edges
    centre = rng.integers(0, [W, H], size=(300, 2))
    centre[:100] = wh[:100] // 2  # left and top edges at -0.5
    boxes = Boxes(np.concatenate([centre, wh], axis=1).astype(np.float64), "CXCYWH", (H, W), clamping_mode=None,
                  dtype="int64")
    sample = Sample(photo_like(H, W, seed=2), {"boxes": boxes, "labels": np.arange(300)})
    image, target = to_tv(sample)
    for name, args in (("ConvertBoundingBoxFormat", ("XYXY",)), ("SanitizeBoundingBoxes", ())):
        want_image, want = getattr(V, name)(*args)(image, target)
        got = ours(name, *args)(sample, np.random.default_rng(0))
        np.testing.assert_array_equal(got.target["labels"], want["labels"].numpy(), err_msg=name)
        np.testing.assert_array_equal(got.target["boxes"].data, want["boxes"].numpy(), err_msg=name)
    assert len(want["labels"]) > 250, "the half-pixel boxes were dropped: the test checks nothing"
