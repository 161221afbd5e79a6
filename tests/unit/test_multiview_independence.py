"""The views of a ``MultiView`` draw independently (docs/design/sample-model.md, stage 3): the
crops and flips of two views of one sample, of one view in two epochs or under two seeds, and the
ops' and interpolation's draws of two views, by chi-square tests of independence on paired draws
at 0.001 (2,000 samples, fixed seeds: the same result on every run). Parameters are read from
``RandomResizedCrop.params`` and the ops' ``row_rng``, without decoding images. Their
distributions against torchvision's: tests/torchvision/test_multiview_distributions.py."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpufeed import MultiView, RandomResizedCrop
from gpufeed.image.augment import ColorJitter
from gpufeed.image.augment._base import ROW_STREAM, row_rng
from tests.torchvision._stats import assert_independent, assert_probability, quantile_bins

pytestmark = pytest.mark.timeout(120)
N = 2000
H, W = 300, 400
SEED = 7


def dino() -> MultiView:
    """DINO's multi-crop: 2 global views and 6 local ones, with flips."""
    return MultiView([RandomResizedCrop(224, scale=(0.4, 1.0))] * 2
                     + [RandomResizedCrop(96, scale=(0.05, 0.4))] * 6)


def crops(view: Any, epoch: int = 0, seed: int = SEED) -> list[Any]:
    return [view.params(seed, epoch, index, H, W) for index in range(N)]


def area_bins(params: list[Any], bins: int = 5) -> list[int]:
    return quantile_bins([p.height * p.width / (H * W) for p in params], bins)


def assert_crops_independent(a: list[Any], b: list[Any], what: str) -> None:
    """Area share (5 bins at its quantiles), centre column (3 bins) and flip of paired crops."""
    assert_independent(area_bins(a), area_bins(b), f"{what}: area shares")
    assert_independent(quantile_bins([p.left + p.width / 2 for p in a], 3),
                       quantile_bins([p.left + p.width / 2 for p in b], 3), f"{what}: centre columns")
    assert_independent([p.flip for p in a], [p.flip for p in b], f"{what}: flips")


@pytest.fixture(scope="module")
def draws() -> list[list[Any]]:
    """Each view's crops of samples 0..N-1 (epoch 0, seed SEED)."""
    return [crops(view) for view in dino().views]


def test_views_0_and_1_of_a_sample_are_independent(draws):
    assert sum(a == b for a, b in zip(draws[0], draws[1])) == 0
    assert_crops_independent(draws[0], draws[1], "views 0 and 1")


def test_every_pair_of_views_is_independent(draws):
    for v, w in itertools.combinations(range(len(draws)), 2):
        assert_crops_independent(draws[v], draws[w], f"views {v} and {w}")


def test_each_view_flips_with_p_half_independently_of_its_crop(draws):
    for v, params in enumerate(draws):
        assert_probability([p.flip for p in params], 0.5, f"view {v}: flips")
        assert_independent(area_bins(params), [p.flip for p in params], f"view {v}: area and flip")


@pytest.mark.parametrize("change", [{"epoch": 1}, {"seed": SEED + 1}], ids=["epoch", "seed"])
def test_a_view_draws_anew_in_another_epoch_or_under_another_seed(change):
    for v, view in list(enumerate(dino().views))[:3]:  # view 0's keys, view 1's, a local view's
        before, after = crops(view), crops(view, **change)
        assert sum(a == b for a, b in zip(before, after)) == 0, v
        assert_crops_independent(before, after, f"view {v}, {change}")


def test_the_ops_and_interpolation_of_two_views_draw_independently():
    """The ops' random numbers (row_rng, stream 0) and the "random" interpolation of views 0 and
    1 of one sample: ColorJitter's brightness factor and its order of ops, and the resampling."""
    jitter = ColorJitter(0.4, 0.4, 0.4, 0.1)
    views = MultiView([RandomResizedCrop(32, interpolation="random", ops=(jitter,))] * 2).views
    drawn = [[jitter.draw(row_rng(SEED, 0, index, ROW_STREAM, v), 32, 32) for index in range(N)]
             for v in (0, 1)]
    brightness = [quantile_bins([dict(p)[0] for p in d], 5) for d in drawn]
    assert_independent(brightness[0], brightness[1], "brightness factors of views 0 and 1")
    first = [[p[0][0] for p in d] for d in drawn]  # which of the 4 adjustments comes first
    assert_independent(first[0], first[1], "first adjustment of views 0 and 1")
    interpolations = [[view.sample_interpolation(SEED, 0, index) for index in range(N)]
                      for view in views]
    assert_independent(interpolations[0], interpolations[1], "interpolation of views 0 and 1")
    assert_probability([i == "bicubic" for i in interpolations[1]], 0.5, "view 1: bicubic")


def test_the_independence_test_catches_a_partly_shared_draw(draws):
    """The test has power: view 0 against itself fails it, and so does view 0 against a view
    that repeats view 0's crop for one sample in four (view 1's otherwise)."""
    with pytest.raises(AssertionError, match="not independent"):
        assert_crops_independent(draws[0], draws[0], "view 0 and itself")
    partly = [a if index % 4 == 0 else b for index, (a, b) in enumerate(zip(draws[0], draws[1]))]
    with pytest.raises(AssertionError, match="area shares.*not independent"):
        assert_crops_independent(draws[0], partly, "view 0 and a quarter of itself")
