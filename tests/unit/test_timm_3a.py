"""timm's Desaturate, GaussianBlur and GaussianBlurRand ops, its "3a" policy and its weighted
RandAugment op sets: level arguments as timm's level functions give them, draws from (seed,
epoch, index) only, and PIL's Gaussian blur as its integer box passes compute it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpufeed.image import augment as A
from gpufeed.image.augment import _functional as fn
from gpufeed.image.augment._timm_rand import TIMM_RAND_3A, apply_timm_op, draw_timm_op
from gpufeed.synth import photo_like


def _draw(name: str, magnitude: float, std: float = 0.0, seed: int = 0, index: int = 0):
    return draw_timm_op(A.row_rng(seed, 0, index), name, 1.0, magnitude, std, None, "random",
                        0.45, 250.0)


@pytest.mark.parametrize("name,magnitude,want", [
    ("Desaturate", 0, 0.5), ("Desaturate", 4, 0.7), ("Desaturate", 10, 1.0),
    ("GaussianBlur", 0, 0.1), ("GaussianBlur", 5, 1.05), ("GaussianBlur", 10, 2.0),
])
def test_level_arguments_are_timms(name, magnitude, want):
    drawn = _draw(name, magnitude)
    assert drawn is not None and drawn[0] == name
    assert drawn[1] == pytest.approx((want,))


def test_gaussian_blur_rand_draws_its_radius_from_the_row_stream():
    radii = [_draw("GaussianBlurRand", 10, index=i)[1][0] for i in range(400)]
    assert min(radii) >= 0.1 and max(radii) < 2.0 and max(radii) - min(radii) > 1.5
    assert radii == [_draw("GaussianBlurRand", 10, index=i)[1][0] for i in range(400)]
    assert radii != [_draw("GaussianBlurRand", 10, seed=1, index=i)[1][0] for i in range(400)]
    half = [_draw("GaussianBlurRand", 5, index=i)[1][0] for i in range(200)]
    assert max(half) < 1.0  # uniform(0.1, 2 x level): level 0.5
    tiny = [_draw("GaussianBlurRand", 0.2, index=i)[1][0] for i in range(200)]
    assert all(0.04 <= r <= 0.1 for r in tiny)  # timm's uniform(0.1, 0.04) runs backwards


def test_magnitude_noise_reaches_the_new_ops():
    levels = {_draw("Desaturate", 7, std=1.0, index=i)[1][0] for i in range(200)}
    assert len(levels) > 100 and min(levels) >= 0.5 and max(levels) <= 1.0


def test_3a_policy_is_timms():
    op = A.TimmAutoAugment.from_config("3a")
    assert op.policy == ((("Solarize", 1.0, 5.0),), (("Desaturate", 1.0, 10.0),),
                         (("GaussianBlurRand", 1.0, 10.0),))
    drawn = [op.draw(A.row_rng(3, 2, i), 64, 64) for i in range(300)]
    assert all(len(d) == 1 for d in drawn)  # each sub-policy has one op of probability 1
    counts = {name: sum(d[0][0] == name for d in drawn) for name in
              ("Solarize", "Desaturate", "GaussianBlurRand")}
    assert all(70 < c < 130 for c in counts.values()), counts
    assert {d[0][1] for d in drawn if d[0][0] == "Solarize"} == {(128,)}
    assert drawn == [op.draw(A.row_rng(3, 2, i), 64, 64) for i in range(300)]
    assert A.TimmAutoAugment.from_config("3a-mstd0.5").magnitude_std == 0.5


def test_t3a_op_set_is_read():
    assert A.TimmRandAugment.from_config("rand-m9-mstd0.5-t3a").ops == TIMM_RAND_3A
    assert A.TimmRandAugment.from_config("rand-m9-t3a-inc1").ops == TIMM_RAND_3A
    assert A.TimmRandAugment.from_config("rand-m9-tother").ops[4] == "Posterize"  # timm's default
    assert A.TimmRandAugment.from_config("rand-m9-t3a-tweights").ops == TIMM_RAND_3A  # the first
    custom = A.TimmRandAugment(ops=("GaussianBlurRand", "Desaturate"), num_layers=1, prob=1.0)
    assert {custom.draw(A.row_rng(0, 0, i), 8, 8)[0][0] for i in range(50)} == {
        "GaussianBlurRand", "Desaturate"}


def test_desaturate_blends_towards_the_grey_image():
    row = photo_like(40, 56, seed=4)
    grey = fn.grayscale(row.copy())
    assert np.array_equal(apply_timm_op(row.copy(), "Desaturate", (1.0,), "random", (0, 0, 0)), grey)
    half = apply_timm_op(row.copy(), "Desaturate", (0.5,), "random", (0, 0, 0))
    assert np.array_equal(half, fn.color(row.copy(), 0.5))
    assert np.abs(half.astype(int) - grey).mean() < np.abs(row.astype(int) - grey).mean()


def _box_pass(x: np.ndarray, kernel: np.ndarray, axis: int) -> np.ndarray:
    """One of PIL's box passes in integers: (weights . repeated-edge neighbours + 2^23) >> 24."""
    weights = np.rint(kernel * (1 << 24)).astype(np.int64)
    half = len(weights) // 2
    n = x.shape[axis]
    total = np.zeros(x.shape, np.int64)
    for k, w in enumerate(weights):
        total += w * np.take(x, np.clip(np.arange(n) + k - half, 0, n - 1), axis=axis)
    return (total + (1 << 23)) >> 24


@pytest.mark.parametrize("radius", [0.07, 0.5, 1.0, 1.37, 2.0, 4.2])
def test_pil_gaussian_blur_is_its_integer_box_passes(radius):
    kernel = fn.box_blur_weights(radius)
    assert math.isclose(kernel.sum(), 1.0, abs_tol=2 ** -23)
    for shape in ((37, 53), (3, 5), (1, 9)):
        row = photo_like(*shape, seed=7)
        want = row.astype(np.int64)
        for axis in (1, 1, 1, 0, 0, 0):
            want = _box_pass(want, kernel, axis)
        got = fn.pil_gaussian_blur(row.copy(), radius)
        assert got.dtype == np.uint8 and np.array_equal(got, want), (radius, shape)


def test_pil_gaussian_blur_keeps_flat_rows_and_radius_zero():
    flat = np.full((20, 30, 3), 173, np.uint8)
    assert np.array_equal(fn.pil_gaussian_blur(flat.copy(), 1.8), flat)
    row = photo_like(20, 30, seed=1)
    assert np.array_equal(fn.pil_gaussian_blur(row.copy(), 0.0), row)


def test_weighted_op_sets_draw_distinct_ops_by_weight():
    op = A.TimmRandAugment.from_config("rand-m9-mstd0.5-inc1-t3aw")
    assert op.ops[:3] == TIMM_RAND_3A and len(op.ops) == 14
    assert op.weights[0] == pytest.approx(6 / 33)
    prob1 = A.TimmRandAugment(("Invert", "Equalize", "Rotate"), 2, prob=1.0, weights=(0, 1, 3))
    draws = [prob1.draw(A.row_rng(2, 0, i), 16, 16) for i in range(600)]
    assert all(len(d) == 2 and d[0][0] != d[1][0] for d in draws)  # without replacement
    assert not any("Invert" in (d[0][0], d[1][0]) for d in draws)  # weight 0: never
    first_rotate = sum(d[0][0] == "Rotate" for d in draws) / len(draws)
    assert 0.68 < first_rotate < 0.82  # 3 / 4
    assert draws == [prob1.draw(A.row_rng(2, 0, i), 16, 16) for i in range(600)]
    assert A.TimmRandAugment.from_config("rand-m9-tweights").ops[0] == "Rotate"
