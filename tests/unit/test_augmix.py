"""gpufeed.image.augment.AugMix and TimmAugMix: draws from (seed, epoch, index) only, apply a pure
function of the draw, the mixing arithmetic, config strings and argument errors."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from gpufeed import RandomResizedCrop
from gpufeed.image import augment as A
from gpufeed.image.augment._augmix import TIMM_AUGMIX_OPS, augmix_space, pil_blend
from gpufeed.synth import encode, photo_like

OPS = (A.AugMix(), A.AugMix(severity=10, mixture_width=1, chain_depth=3, alpha=0.5,
                            all_ops=False, interpolation="nearest", fill=(1, 2, 3)),
       A.TimmAugMix(), A.TimmAugMix.from_config("augmix-m5-w4-d2"),
       A.TimmAugMix.from_config("augmix-m9-w2-b1-mstd0.5"))
ROW = photo_like(48, 56, seed=4)


@pytest.mark.parametrize("op", OPS, ids=lambda op: repr(op)[:40])
def test_draws_depend_on_seed_epoch_index_and_apply_draws_nothing(op):
    params = op.draw(A.row_rng(1, 2, 3), 48, 56)
    assert params == op.draw(A.row_rng(1, 2, 3), 48, 56)
    assert params != op.draw(A.row_rng(1, 2, 4), 48, 56)
    row = ROW.copy()
    first = op.apply(row, params)
    assert np.array_equal(row, ROW)  # the original is read, never written
    assert first.shape == ROW.shape and first.dtype == np.uint8
    assert np.array_equal(first, op.apply(ROW.copy(), params))
    assert pickle.loads(pickle.dumps(op)) == op  # ops travel to spawned workers
    assert not np.array_equal(first, ROW)


def test_torchvision_draws_have_augmix_shapes():
    op = A.AugMix(severity=2, mixture_width=4)
    names = {name for name, _ in augmix_space(True, 48, 56)}
    for k in range(50):
        m0, weights, chains = op.draw(A.row_rng(0, 0, k), 48, 56)
        assert len(weights) == len(chains) == 4
        assert math.isclose(m0 + sum(weights), 1.0, abs_tol=1e-5)
        assert all(1 <= len(chain) <= 3 for chain in chains)
        for name, magnitude in (c for chain in chains for c in chain):
            assert name in names
            mags = dict(augmix_space(True, 48, 56))[name]
            assert mags is None or abs(magnitude) in {float(v) for v in mags[:2]}
    fixed = A.AugMix(mixture_width=2, chain_depth=2).draw(A.row_rng(0, 0, 0), 48, 56)
    assert [len(c) for c in fixed[2]] == [2, 2]
    assert len(augmix_space(False, 48, 56)) == 9 and len(augmix_space(True, 48, 56)) == 13


def test_timm_draws_have_augmix_shapes():
    op = A.TimmAugMix.from_config("augmix-m5-w4-d2")
    for k in range(30):
        weights, m, chains = op.draw(A.row_rng(0, 0, k), 48, 56)
        assert len(weights) == 4 and math.isclose(sum(weights), 1.0, abs_tol=1e-5) and 0 <= m <= 1
        assert [len(c) for c in chains] == [2, 2, 2, 2]
        assert all(name in TIMM_AUGMIX_OPS for chain in chains for name, _, _ in chain)


def test_mixing_arithmetic():
    op = A.AugMix()
    assert np.array_equal(op.apply(ROW.copy(), (1.0, (0.0,), ((("Equalize", 0.0),),))), ROW)
    assert np.array_equal(op.apply(ROW.copy(), (0.5, (0.5,), ((),))), ROW)
    # torchvision mixes in float32 and truncates: 0.5 x + 0.5 (255 - x) is 127.5 -> 127
    got = A.AugMix(mixture_width=1).apply(ROW.copy(), (0.5, (0.5,), ((("Invert", 0.0),),)))
    assert (got == 127).all()
    timm = A.TimmAugMix(width=1)
    assert np.array_equal(timm.apply(ROW.copy(), ((1.0,), 0.0, ((),))), ROW)
    inverted = timm.apply(ROW.copy(), ((1.0,), 0.5, ((("Invert", (), "random"),),)))
    assert (inverted == 127).all()
    a, b = np.full((2, 2, 3), 10, np.uint8), np.full((2, 2, 3), 200, np.uint8)
    assert pil_blend(a, b, 0.5)[0, 0, 0] == 105 and pil_blend(b, a, 0.3)[0, 0, 0] == 143
    blended = A.TimmAugMix(width=2, blended=True)
    assert np.array_equal(blended.apply(ROW.copy(), ((0.5, 0.5), 0.0, ((), ()))), ROW)


def test_timm_config_is_read():
    op = A.TimmAugMix.from_config("augmix-m7-w2-d3-a0.5-b1-mstd0.4", fill=(1, 2, 3),
                                  translate_pct=0.3)
    assert (op.magnitude, op.width, op.depth, op.alpha, op.blended, op.magnitude_std) == (
        7.0, 2, 3, 0.5, True, 0.4)
    assert op.fill == (1, 2, 3) and op.translate_pct == 0.3 and op.ops == TIMM_AUGMIX_OPS
    default = A.TimmAugMix.from_config("augmix")
    assert (default.magnitude, default.width, default.depth, default.magnitude_std) == (
        3.0, 3, -1, math.inf)


@pytest.mark.parametrize("bad,match", [
    (lambda: A.AugMix(severity=0), r"`severity` must be an int in \[1, 10\]"),
    (lambda: A.AugMix(severity=11), r"`severity` must be an int in \[1, 10\]"),
    (lambda: A.AugMix(mixture_width=0), "`mixture_width` must be an int >= 1"),
    (lambda: A.AugMix(chain_depth=1.5), "`chain_depth` must be an int"),
    (lambda: A.AugMix(alpha=0.0), "`alpha` must be a finite number > 0"),
    (lambda: A.AugMix(alpha=math.nan), "`alpha` must be a finite number > 0"),
    (lambda: A.AugMix(all_ops=1), "`all_ops` must be True or False"),
    (lambda: A.AugMix(interpolation="area"), "`interpolation` must be"),
    (lambda: A.AugMix(fill=300), "levels must be numbers in"),
    (lambda: A.TimmAugMix(ops=("Sepia",)), "`ops` must be timm op names"),
    (lambda: A.TimmAugMix(ops=()), "`ops` must be timm op names"),
    (lambda: A.TimmAugMix(width=0), "`width` must be an int >= 1"),
    (lambda: A.TimmAugMix(blended="yes"), "`blended` must be True or False"),
    (lambda: A.TimmAugMix(magnitude_std=-1), "`magnitude_std` must be >= 0"),
    (lambda: A.TimmAugMix.from_config("rand-m9"), "starts with 'augmix'"),
    (lambda: A.TimmAugMix.from_config("augmix-q3"), "unknown section 'q'"),
    (lambda: A.TimmAugMix.from_config("augmix-m3x"), "m takes a number"),
])
def test_bad_arguments_fail_at_construction(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bad()


def test_augmix_on_the_fast_path_rows():
    data = encode(photo_like(150, 190, seed=3))
    t = RandomResizedCrop(64, ops=(A.AugMix(),))
    assert not t.deterministic
    for index in range(3):
        hwc = np.empty((64, 64, 3), np.uint8)
        chw = np.empty((3, 64, 64), np.uint8)
        t.apply(data, index=index, epoch=1, seed=5, out=hwc)
        t.apply(data, index=index, epoch=1, seed=5, out=chw)
        assert np.array_equal(chw, hwc.transpose(2, 0, 1))
        base = np.empty((64, 64, 3), np.uint8)
        RandomResizedCrop(64).apply(data, index=index, epoch=1, seed=5, out=base)
        assert np.array_equal(A.RowOps(t.ops).apply(base, 5, 1, index), hwc)
