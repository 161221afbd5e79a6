"""The affine, rotation and photometric joint ops draw their parameters from torchvision v2's
distributions: each continuous parameter against ``make_params`` by two-sample
Kolmogorov-Smirnov, each discrete one (integer shifts, whether an adjustment applies, contrast
first or last, the channel permutation) by chi-square, at 0.001 over 2,000 draws a side from
fixed seeds (the same result on every run). Needs torchvision (.venv-tv)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from gpufeed.image.detection import _affine, _photometric  # noqa: E402
from gpufeed.image.detection._sample import Sample, sample_rng  # noqa: E402
from tests.torchvision._stats import assert_same_categories, assert_same_continuous  # noqa: E402

pytestmark = pytest.mark.timeout(300)
N = 2000
H, W = 90, 130


def draws(ours: Any, theirs: Any) -> tuple[list[Any], list[Any]]:
    sample = Sample(np.zeros((H, W, 3), np.uint8), None)
    a = [ours.draw(sample_rng(11, 0, i), sample) for i in range(N)]
    torch.manual_seed(11)
    flat = [tv_tensors.Image(torch.zeros(3, H, W, dtype=torch.uint8))]
    b = [theirs.make_params(flat) for _ in range(N)]
    return a, b


@pytest.mark.parametrize("args", [
    dict(degrees=30, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5)),
    dict(degrees=(-5, 170), translate=(0.05, 0.5), scale=(0.5, 2.0), shear=15),
])
def test_random_affine_draws(args: dict[str, Any]) -> None:
    a, b = draws(_affine.RandomAffine(**args), V.RandomAffine(**args))
    for key in ("angle", "scale"):
        assert_same_continuous([p[key] for p in a], [p[key] for p in b], key)
    for i, axis in enumerate("xy"):
        assert_same_categories([int(p["translate"][i]) for p in a], [int(p["translate"][i]) for p in b],
                               f"translate {axis}")
    assert_same_continuous([p["shear"][0] for p in a], [p["shear"][0] for p in b], "shear x")
    if isinstance(args["shear"], tuple) and len(args["shear"]) == 4:
        assert_same_continuous([p["shear"][1] for p in a], [p["shear"][1] for p in b], "shear y")
    else:
        assert all(p["shear"][1] == 0.0 for p in a)


@pytest.mark.parametrize("degrees", [45, (-170, 10)])
def test_random_rotation_draws(degrees: Any) -> None:
    a, b = draws(_affine.RandomRotation(degrees, expand=True), V.RandomRotation(degrees, expand=True))
    assert_same_continuous([p["angle"] for p in a], [p["angle"] for p in b], "angle")


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_random_photometric_distort_draws(p: float) -> None:
    a, b = draws(_photometric.RandomPhotometricDistort(p=p), V.RandomPhotometricDistort(p=p))
    none = {"brightness_factor": None, "contrast_factor": None, "saturation_factor": None,
            "hue_factor": None, "contrast_before": None, "channel_permutation": None}
    a = [none if x is None else x for x in a]  # ours: None when nothing applies
    for key in ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor"):
        assert_same_categories([x[key] is None for x in a], [x[key] is None for x in b], f"{key} applied")
        assert_same_continuous([x[key] for x in a if x[key] is not None],
                               [x[key] for x in b if x[key] is not None], key)

    def applied(x: dict[str, Any]) -> bool:  # ours drops the parameters of a no-op draw
        return any(x[k] is not None for k in none if k != "contrast_before")

    assert_same_categories([x["contrast_before"] for x in a if applied(x)],
                           [x["contrast_before"] for x in b if applied(x)], "contrast before")

    def perm(x: dict[str, Any]) -> Any:
        q = x["channel_permutation"]
        return None if q is None else tuple(int(i) for i in q)

    assert_same_categories([perm(x) for x in a], [perm(x) for x in b], "channel permutation")
