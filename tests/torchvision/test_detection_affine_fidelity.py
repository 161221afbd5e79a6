"""The affine and photometric joint ops give torchvision v2's outputs given the same parameters:
each op's ``params`` go through the torchvision op's own ``transform`` (so its fill per type,
its rot90 fast path and its expand rules are the reference). Boxes (XYXY, XYWH, CXCYWH; soft,
hard and no clamping) and keypoints within 1e-3 px, canvases equal; masks pixel for pixel
(nearest on torchvision's own grid); images against the tensor kernel: nearest-neighbour by the
share of differing pixels (measured at most 0.01% over 240 random draws; bound 0.1%), bilinear
by the mean absolute difference (measured at most 0.004 levels: one level off on some pixels
of the warped edge's band; bound 0.1 level); against the PIL kernel (the same warp sampled by
PIL) within GEOMETRY levels on average, or no farther than torchvision's tensor kernel is.
RandomPhotometricDistort against the PIL kernels within POINT (1 level, mean; measured up to
0.64) and against the tensor kernels within COLOUR (2 levels, mean) or no farther than
torchvision's PIL kernels are.
Needs torchvision (.venv-tv)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from gpufeed.image.detection import _affine, _photometric  # noqa: E402
from gpufeed.image.detection._sample import BOX_FORMATS, Boxes, KeyPoints, Mask, Sample, sample_rng  # noqa: E402
from gpufeed.synth import photo_like  # noqa: E402
from tests.torchvision._augment import COLOUR, GEOMETRY, POINT, mean_abs, share_differing  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SIZES = ((61, 83), (96, 96), (120, 75))

# (torchvision op, our op): the same arguments
OPS = [
    dict(kind="RandomAffine", degrees=30, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5)),
    dict(kind="RandomAffine", degrees=(-180, 180), scale=(0.5, 2.0), interpolation="bilinear"),
    dict(kind="RandomAffine", degrees=15, shear=20, fill={tv_tensors.Image: (124, 116, 104), tv_tensors.Mask: 255},
         center=(10.0, 20.0)),
    dict(kind="RandomAffine", degrees=10, translate=(0.3, 0.3), interpolation="bilinear", fill=40),
    dict(kind="RandomRotation", degrees=45),
    dict(kind="RandomRotation", degrees=(-170, 170), expand=True),
    dict(kind="RandomRotation", degrees=(90, 90), expand=True),
    dict(kind="RandomRotation", degrees=(180, 180)),
    dict(kind="RandomRotation", degrees=(270, 270)),
    dict(kind="RandomRotation", degrees=30, center=(5.0, 50.0), interpolation="bilinear",
         fill={tv_tensors.Image: 200, "others": 3}),
    dict(kind="RandomRotation", degrees=30, center=(30.0, 20.0), expand=True),
]


ATTRIBUTES = {"RandomAffine": ("degrees", "translate", "scale", "shear", "interpolation", "fill", "center"),
              "RandomRotation": ("degrees", "interpolation", "expand", "center", "fill")}


def make_ops(config: dict[str, Any]) -> tuple[Any, Any]:
    """The torchvision op, and ours built from its attributes (as a translation builds it)."""
    tv_args = {k: v for k, v in config.items() if k != "kind"}
    if "interpolation" in tv_args:
        tv_args["interpolation"] = V.InterpolationMode(tv_args["interpolation"])
    theirs = getattr(V, config["kind"])(**tv_args)
    ours = getattr(_affine, config["kind"])(**{k: getattr(theirs, k) for k in ATTRIBUTES[config["kind"]]})
    return ours, theirs


def make_sample(height: int, width: int, seed: int) -> Sample:
    rng = np.random.default_rng(seed)
    image = photo_like(height, width, seed=seed)
    n = 6
    xy = rng.uniform(-5, [width, height], (n, 2))
    wh = rng.uniform(1, [width / 2, height / 2], (n, 2))
    xyxy = np.concatenate([xy, xy + wh], axis=1).astype(np.float32).astype(np.float64)
    planes = rng.integers(0, 4, (3, height, width)).astype(np.uint8)
    keypoints = rng.uniform(-3, [width + 3, height + 3], (n, 3, 2)).astype(np.float32).astype(np.float64)
    return Sample(image, {"xyxy": xyxy, "masks": Mask(planes), "plane": Mask(planes[0].astype(np.int64)),
                          "bool": Mask(planes[1] > 1), "none": Mask(planes[:0]),
                          "float": Mask(planes[2].astype(np.float32) / 3), "int32": Mask(planes.astype(np.int32)),
                          "keypoints": KeyPoints(keypoints, (height, width))})


def convert(xyxy: np.ndarray, fmt: str) -> np.ndarray:
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(xyxy).float(), format="XYXY", canvas_size=(1, 1),
                                     clamping_mode=None)
    return V.ConvertBoundingBoxFormat(fmt)(boxes).numpy().astype(np.float64)


def cases() -> list[tuple[int, int, int]]:
    return [(c, s, seed) for c in range(len(OPS)) for s in range(len(SIZES)) for seed in range(2)]


@pytest.mark.parametrize("config, size, seed", cases())
def test_geometry_matches_torchvision(config: int, size: int, seed: int) -> None:
    ours, theirs = make_ops(OPS[config])
    height, width = SIZES[size]
    base = make_sample(height, width, seed)
    params = ours.draw(sample_rng(seed, 0, config), base)
    masks = ("masks", "plane", "bool", "none", "float", "int32")
    target: dict[str, Any] = {k: base.target[k] for k in (*masks, "keypoints")}
    tv_target: dict[str, Any] = {
        **{k: tv_tensors.Mask(torch.from_numpy(base.target[k].dense().copy())) for k in masks},
        "keypoints": tv_tensors.KeyPoints(torch.from_numpy(base.target["keypoints"].data).float(),
                                          canvas_size=(height, width))}
    for fmt in BOX_FORMATS:
        data = convert(base.target["xyxy"], fmt)
        for mode in ("soft", "hard", None):
            target[f"{fmt}-{mode}"] = Boxes(data, fmt, (height, width), mode)
            tv_target[f"{fmt}-{mode}"] = tv_tensors.BoundingBoxes(
                torch.from_numpy(data).float(), format=fmt, canvas_size=(height, width), clamping_mode=mode)
    image = base.image.copy()
    out = ours.apply(Sample(image, target), params)
    tv_image = tv_tensors.Image(torch.from_numpy(base.image).permute(2, 0, 1).contiguous())
    ref = {k: theirs.transform(v, params) for k, v in tv_target.items()}
    ref_image = theirs.transform(tv_image, params).permute(1, 2, 0).numpy()

    for key, value in ref.items():
        got = out.target[key]
        if isinstance(value, tv_tensors.BoundingBoxes):
            assert got.canvas == tuple(value.canvas_size), key
            np.testing.assert_allclose(got.data, value.numpy(), atol=1e-3, err_msg=key)
        elif isinstance(value, tv_tensors.KeyPoints):
            assert got.canvas == tuple(value.canvas_size)
            np.testing.assert_allclose(got.data, value.numpy(), atol=1e-3)
        else:
            dense = got.dense()
            assert dense.dtype == value.numpy().dtype and dense.shape == value.shape, key
            np.testing.assert_array_equal(dense, value.numpy(), err_msg=key)
    assert out.image.shape == ref_image.shape
    if ours.interpolation == "nearest":
        assert share_differing(out.image, ref_image) <= 0.001
    else:
        assert mean_abs(out.image, ref_image) <= 0.1
    if isinstance(OPS[config].get("fill"), dict):
        return  # a PIL image is not a tv_tensors.Image: torchvision fills it with "others"
    pil = np.asarray(theirs.transform(Image.fromarray(base.image), params))
    if pil.shape == out.image.shape:  # PIL's expand may round the size its own way
        # on quarter turns of non-square images PIL's and the tensor kernel's pixels sit a
        # half-pixel tie apart (PIL floors, torch rounds to even): no farther than torchvision's own
        assert mean_abs(out.image, pil) <= max(GEOMETRY, mean_abs(ref_image, pil) + 0.1)


def test_photometric_distort_matches_torchvision() -> None:
    theirs = V.RandomPhotometricDistort(p=0.7)
    ours = _photometric.RandomPhotometricDistort(**{k: getattr(theirs, k) for k in (
        "brightness", "contrast", "saturation", "hue", "p")})
    checked = 0
    for seed in range(24):
        height, width = SIZES[seed % len(SIZES)]
        image = photo_like(height, width, seed=seed)
        params = ours.draw(sample_rng(seed, 0, 0), Sample(image, None))
        if params is None:
            continue
        tv_params = dict(params)
        if params["channel_permutation"] is not None:
            tv_params["channel_permutation"] = torch.tensor(params["channel_permutation"])
        got = ours.apply(Sample(image.copy(), None), params).image
        pil = np.asarray(theirs.transform(Image.fromarray(image), tv_params))
        tensor = theirs.transform(torch.from_numpy(image).permute(2, 0, 1).contiguous(), tv_params)
        assert mean_abs(got, pil) <= POINT, params
        tensor = tensor.permute(1, 2, 0).numpy()  # hue in float HSV: up to 2.1 levels (60 cases)
        assert mean_abs(got, tensor) <= max(COLOUR, mean_abs(pil, tensor) + POINT / 4), params
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("config", range(len(OPS)))
def test_integer_boxes_and_keypoints_equal_torchvisions_exactly(config: int) -> None:
    """Integer leaves are warped in float32 with torch's matmul and cast back, as torchvision
    does: quarter turns put corners on whole numbers, where float64 may land on the other side."""
    ours, theirs = make_ops(OPS[config])
    for seed in range(6):
        height, width = 200 + 7 * seed, 260 + 5 * seed
        rng = np.random.default_rng(seed)
        x0, y0 = rng.integers(0, width - 10, 8), rng.integers(0, height - 10, 8)
        x1, y1 = np.minimum(x0 + rng.integers(1, 200, 8), width), np.minimum(y0 + rng.integers(1, 200, 8), height)
        x1[:4], y1[:4] = width, height  # boxes on the right and bottom edges
        xyxy = np.stack([x0, y0, x1, y1], 1)
        points = rng.integers(-3, min(width, height) + 3, (8, 3, 2))
        target: dict[str, Any] = {"points": KeyPoints(points.astype(np.float64), (height, width), dtype="int64")}
        tv_target: dict[str, Any] = {"points": tv_tensors.KeyPoints(torch.from_numpy(points),
                                                                   canvas_size=(height, width))}
        for fmt in BOX_FORMATS:
            for mode in ("soft", None):
                data = convert(xyxy.astype(np.float64), fmt) if fmt != "CXCYWH" else \
                    convert((xyxy + np.concatenate([np.zeros((8, 2)), (xyxy[:, 2:] - xyxy[:, :2]) % 2], 1))
                            .astype(np.float64), fmt)  # even sizes: whole centres
                target[f"{fmt}-{mode}"] = Boxes(data, fmt, (height, width), mode, dtype="int64")
                tv_target[f"{fmt}-{mode}"] = tv_tensors.BoundingBoxes(
                    torch.from_numpy(data.astype(np.int64)), format=fmt, canvas_size=(height, width),
                    clamping_mode=mode)
        sample = Sample(np.zeros((height, width, 3), np.uint8), target)
        params = ours.draw(sample_rng(seed, 0, config), sample)
        out = ours.apply(sample, params)
        for key, value in tv_target.items():
            want = theirs.transform(value, params)
            assert want.dtype == torch.int64
            got = out.target[key]
            assert got.canvas == tuple(want.canvas_size), key
            np.testing.assert_array_equal(got.data.astype(np.int64), want.numpy(), err_msg=f"{key} {params}")
