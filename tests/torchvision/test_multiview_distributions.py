"""Each view of DINO's multi-crop, translated from torchvision v2 into a ``MultiView``, draws its
crop from torchvision's distribution: the crop's area share, log aspect ratio and centre (row and
column, as fractions of the image) against ``RandomResizedCrop.get_params`` by two-sample
Kolmogorov-Smirnov tests, how often it falls back to the centre crop by chi-square, and its flip
against p=0.5 by chi-square; at 0.001 over 2,000 draws a side from fixed seeds (the same result
on every run), on a landscape image and on a portrait one too narrow for most global crops.
Parameters come from each view's ``params``, without decoding images. Independence of the views:
tests/unit/test_multiview_independence.py. Needs torchvision (.venv-tv)."""

from __future__ import annotations

import math
from typing import Any

import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402

from gpufeed import MultiView, RandomResizedCrop  # noqa: E402
from tests.torchvision._stats import (  # noqa: E402
    assert_probability,
    assert_same_categories,
    assert_same_continuous,
)

pytestmark = pytest.mark.timeout(120)
N = 2000
SEED = 7


def dino_view(size: int, scale: tuple[float, float]) -> V.Compose:
    """The geometry of one of DINO's views (its DataAugmentationDINO, in torchvision v2)."""
    return V.Compose([V.RandomResizedCrop(size, scale=scale, interpolation=V.InterpolationMode.BICUBIC),
                      V.RandomHorizontalFlip(p=0.5), V.ToImage()])


@pytest.fixture(scope="module")
def views() -> MultiView:
    views = MultiView([dino_view(224, (0.4, 1.0))] * 2 + [dino_view(96, (0.05, 0.4))] * 6)
    assert views.translated, views.blockers
    return views


def features(boxes: list[tuple[int, int, int, int]], height: int, width: int) -> dict[str, list[Any]]:
    """What is compared, from (top, left, height, width) boxes."""
    return {"area share": [h * w / (height * width) for _, _, h, w in boxes],
            "log aspect ratio": [math.log(w / h) for _, _, h, w in boxes],
            "centre row": [(t + h / 2) / height for t, _, h, _ in boxes],
            "centre column": [(le + w / 2) / width for _, le, _, w in boxes]}


def fell_back(box: tuple[int, int, int, int], height: int, width: int, ratio: tuple[float, float]) -> bool:
    """Whether a box is the centre crop both sides take after 10 tries without a fit."""
    t, le, h, w = box
    in_ratio = width / height
    if in_ratio < ratio[0]:
        want = (width, round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        want = (round(height * ratio[1]), height)
    else:
        want = (width, height)
    return (w, h) == want and (t, le) == ((height - h) // 2, (width - w) // 2)


@pytest.mark.parametrize("height, width", [(300, 400), (500, 240)])
def test_each_view_s_crop_and_flip_follow_torchvision_s_distribution(views, height, width):
    image = torch.zeros(3, height, width)
    fallbacks = 0
    for v, view in enumerate(views.views):
        geometry = view.geometry
        assert isinstance(geometry, RandomResizedCrop) and geometry.flip, view
        size, scale = (224, (0.4, 1.0)) if v < 2 else (96, (0.05, 0.4))
        assert geometry.output_size == (size, size) and geometry.scale == scale
        drawn = [view.params(SEED, 0, index, height, width) for index in range(N)]
        mine = [(p.top, p.left, p.height, p.width) for p in drawn]
        torch.manual_seed(v)
        theirs = [tuple(T.RandomResizedCrop.get_params(image, list(scale), list(geometry.ratio)))
                  for _ in range(N)]
        ours_f, theirs_f = features(mine, height, width), features(theirs, height, width)
        for what in ours_f:
            assert_same_continuous(ours_f[what], theirs_f[what], f"view {v}, {height}x{width}: {what}")
        mine_fb = [fell_back(b, height, width, geometry.ratio) for b in mine]
        assert_same_categories(mine_fb, [fell_back(b, height, width, geometry.ratio) for b in theirs],
                               f"view {v}, {height}x{width}: centre-crop fallback")
        fallbacks += sum(mine_fb)
        assert_probability([p.flip for p in drawn], 0.5, f"view {v}, {height}x{width}: flips")
    if height > width:  # the portrait image makes the global views fall back now and then
        assert fallbacks > 20, fallbacks
